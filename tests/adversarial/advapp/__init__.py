"""Receivers for the adversarial suite (installed only by ``tests.adversarial.settings``, which
the suite's consumer subprocess uses; the test process registers them for one test at a time)."""
