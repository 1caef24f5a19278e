"""``shipyard ui``: the web dashboard (a Starlette app and the static assets in this package).

It lives on the top floor beside ``cli/`` and ``server/``: it reads jobs through
``control`` and logs and metrics through ``observe``; nothing below it imports it.
"""
