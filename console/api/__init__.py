"""The JSON API under ``/api/v1/``: django-ninja, one NinjaAPI, a router per resource.

Reads come from the committed projections and the log; every write goes through
``runtime.operations``, with the token's user recorded as the actor.
"""
