"""The API reference: HTML generated from the docstrings of veil's public
modules with pdoc (a test dependency: ``pip install -e '.[test]'``).

``scripts/gen_api_docs.py`` writes it into docs/api/ (not committed: it is
built from the code, like the generated protocol code is checked against
protos/); tests/tools/test_apidocs.py builds it in CI and fails on any warning.
"""

from __future__ import annotations

import warnings
from pathlib import Path

#: The modules an application or an operator's tooling imports. Each
#: package's ``__all__`` says which of its names are public.
PUBLIC_MODULES = (
    "veil.client",
    "veil.collector",
    "veil.survey",
    "veil.vdaf",
    "veil.dp",
    "veil.messages",
)


def build(out: Path) -> list[str]:
    """Write the reference into `out` (index.html and one page per module);
    returns pdoc's warnings (text), which a clean build has none of."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="restructuredtext", footer_text="veil API reference")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*PUBLIC_MODULES, output_directory=out)
    return [f"{w.category.__name__}: {w.message}" for w in caught]
