"""Grading one submission: read it, run the checks against the reference through the sandbox, score, report."""
