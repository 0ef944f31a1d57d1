"""A reference to one Kubernetes object (pure): what a plan deletes and patches, and what names a child by."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True, order=True)
class ObjectRef:
    api_version: str
    kind: str
    namespace: str
    name: str
    # The object seen, when known: a delete then removes that one and never a replacement of the same name.
    uid: str = field(default="", compare=False)

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> "ObjectRef":
        meta = obj.get("metadata") or {}
        return cls(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"], meta.get("uid") or "")

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"
