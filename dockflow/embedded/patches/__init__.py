"""Fixes applied to nx-27017 and neosqlite before the embedded server starts, one module per
defect (`dockflow.embedded.launcher` applies them in order).

Each replaces a private method of the exact versions pinned in pyproject.toml; each module's
docstring names the defect, what MongoDB does instead, and the test that pins it. None changes
what a query means on real MongoDB.
"""
