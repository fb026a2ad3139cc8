"""A receiver that queries the database, for the database-down scenario (installed only by
``tests.faults.settings``, which the scenario's consumer subprocess uses)."""
