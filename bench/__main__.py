"""`python -m bench ...`: the `bench` command without installing the project (repository root on PYTHONPATH)."""

from bench.cli import main

if __name__ == "__main__":
    main()
