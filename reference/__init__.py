"""Instructor implementations: the single source of the solution code, and fast peers for timing."""
