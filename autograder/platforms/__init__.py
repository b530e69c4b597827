"""Platform adapters: Gradescope and GitHub Classroom, each over the one shared "grade a submission folder"."""
