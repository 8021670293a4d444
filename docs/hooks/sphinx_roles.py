"""Griffe extension: Sphinx roles in docstrings rendered as code in the API reference.

The docstrings are written for Sphinx as well (``:class:`~hypertorch_sid.SIDConfig```); Markdown
would show the role's name as text. Each role becomes a code span of the name it points at, the
``~`` form keeping only the last component, as Sphinx shows it.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`([^`]+)`")


def _shown(target: str) -> str:
    target = target.strip()
    if "<" in target and target.endswith(">"):  # :class:`title <path>`
        return target.split("<", 1)[0].strip()
    if target.startswith("~"):
        return target[1:].rsplit(".", 1)[-1]
    return target.lstrip(".")


def without_roles(text: str) -> str:
    """``:class:`~a.B``` → ```B```; ``:func:`a.f``` → ```a.f```."""
    return ROLE.sub(lambda m: f"`{_shown(m.group(1))}`", text)


class SphinxRoles(griffe.Extension):
    """Rewrites every loaded docstring once (see the module docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = without_roles(obj.docstring.value)
