"""Runs on disk: what each run created (its record), and removing exactly that (teardown and
``fabriclab clean``)."""
