"""The untrusted side: what the worker boots, and nothing the grader ever imports (see `launcher.BOOT`)."""
