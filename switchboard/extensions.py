"""Per-app state kept in ``app.extensions`` (Flask's convention), with typed accessors."""

from __future__ import annotations

from flask import Flask

from switchboard.config import Config
from switchboard.db import Database
from switchboard.services.todos import TodoDefaults

_KEY = "switchboard"


class State:
    def __init__(self, config: Config, db: Database) -> None:
        self.config = config
        self.db = db
        self.todo_defaults = TodoDefaults(
            lease_seconds=config.default_lease_seconds, max_attempts=config.default_max_attempts
        )


def init_app(app: Flask, state: State) -> None:
    """Attach Switchboard's state to the app."""
    app.extensions[_KEY] = state


def state(app: Flask) -> State:
    """The app's Switchboard state."""
    value: State = app.extensions[_KEY]
    return value


def database(app: Flask) -> Database:
    """The app's database."""
    return state(app).db
