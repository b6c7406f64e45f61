"""Request-body schemas in the OpenAPI document for routes that parse their raw body themselves.

The handlers read `Request` directly (to control errors and streaming), so FastAPI knows nothing
of their bodies; describing them lets clients and schema-driven fuzzers (schemathesis, the
reliability suite) see what each route accepts.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic import TypeAdapter

REF_TEMPLATE = "#/components/schemas/{model}"


def document_request_bodies(app: FastAPI, bodies: dict[str, Any]) -> None:
    """Add `{path: type}` (a pydantic model or dataclass) as the JSON body of the path's operations."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        cached = app.openapi_schema is not None
        document = build()  # FastAPI caches the document in app.openapi_schema: amend it once
        if cached:
            return document
        components = document.setdefault("components", {}).setdefault("schemas", {})
        for path, kind in bodies.items():
            schema = TypeAdapter(kind).json_schema(ref_template=REF_TEMPLATE)
            components.update(schema.pop("$defs", {}))
            for operation in document["paths"].get(path, {}).values():
                operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        return document

    app.openapi = openapi
