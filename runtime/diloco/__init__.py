"""Decoupled DiLoCo: the controller's event loop, its learners, the syncer, the clock and the ledger.

One entry point, `runtime.diloco.controller.train_diloco`; every other module here serves it.
"""
