"""The ``fabriclab`` command, a thin shell: :mod:`.main` parses the command line once into a
typed request (:mod:`.requests`) and hands it to the command's handler (:mod:`.experiments`,
:mod:`.fabric`, :mod:`.runs`, :mod:`.telemetry`), which calls the experiment layer and shows
what comes back (:mod:`.tables`, :mod:`.output`). A handler's module is imported only when its
command runs, so ``validate``, ``schema`` and ``--help`` load no system adapter."""
