"""gunicorn's configuration: ``gunicorn -c gunicorn.conf.py wsgi:app`` (gunicorn also reads this
file by itself when started in this directory). The settings and hooks are exactly those of
``switchboard serve`` (switchboard/gunicorn_conf.py), from the same ``SWITCHBOARD_*``
environment; command-line flags override them. Unlike ``serve`` it starts no PostgreSQL and
applies no migrations: set ``DATABASE_URL`` and run ``switchboard migrate`` first."""

from switchboard import config as _config
from switchboard import gunicorn_conf as _conf

globals().update(_conf.settings(_config.load()))
