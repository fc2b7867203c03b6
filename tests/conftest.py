"""Every test's: a test run started with SIGHUP ignored (under ``nohup``) keeps surviving a
hangup, but the commands its tests start get SIGHUP as a terminal gives it (a Python handler,
unlike an ignored signal, is not inherited across exec): fabriclab keeps SIGHUP ignored where
it started so (``nohup fabriclab run``), and the tests that hang up on a run would see it
run on."""

import signal

if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
    signal.signal(signal.SIGHUP, lambda _signum, _frame: None)
