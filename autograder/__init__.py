"""The autograder for the parallel-attention-heads exercise: a trusted grader and an untrusted worker."""
