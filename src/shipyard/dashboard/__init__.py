"""``shipyard ui``: the web dashboard (Starlette app + static assets in this package)."""
