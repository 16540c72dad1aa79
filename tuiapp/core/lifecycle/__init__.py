"""A run's life: the service that starts it, the supervisor that watches it, the doctor that explains it."""
