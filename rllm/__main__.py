"""`python -m rllm` and the `rllm` console script."""

from rllm.cli import main

if __name__ == "__main__":
    main()
