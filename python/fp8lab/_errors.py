"""fp8lab's Python exceptions beside the C++ library's fp8lab.Error (a ValueError)."""


class UsageError(RuntimeError, ValueError):
    """A call in the wrong state (a context entered twice, update() before step()): a
    RuntimeError as torch raises for the same misuse (GradScaler's), and a ValueError as
    fp8lab raises for every other bad call, so either except clause catches it."""
