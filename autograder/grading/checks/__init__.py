"""The checks: pytest tests run in the trusted grader process, one module per part."""
