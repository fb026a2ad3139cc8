"""The tasks of the ``tasks`` benchmark (``bench/tasks.py``), the same for every backend."""
