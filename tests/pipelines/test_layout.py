"""The tree's rules that the import contracts (pyproject.toml, `make lint`) cannot see: a use
case's names stay in its folder, and README's Layout names every package."""

import re

import pytest

from components.base.config import REPO_ROOT

# The taxi use case's columns: product code outside its folder must not name them.
TAXI_COLUMNS = (
    "payment_type", "trip_miles", "trip_seconds", "fare", "big_tipper", "pickup_community_area",
)  # fmt: skip
# The images use case's classes and model names.
IMAGES_NAMES = ("circle", "triangle", "small_cnn", "efficientnet")
USE_CASES = REPO_ROOT / "components" / "use_cases"


def _product_modules(outside: str = "taxi"):
    for top in ("pipelines", "components"):
        for path in sorted((REPO_ROOT / top).rglob("*.py")):
            if USE_CASES / outside not in path.parents:
                yield path


@pytest.mark.parametrize("use_case, names", [("taxi", TAXI_COLUMNS), ("images", IMAGES_NAMES)])
def test_no_use_case_name_is_named_outside_its_folder(use_case, names):
    pattern = re.compile(r"\b(" + "|".join(names) + r")", re.IGNORECASE)
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in _product_modules(use_case)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert len(list(_product_modules(use_case))) > 50  # the scan saw the tree
    assert found == []


def test_product_code_builds_its_config_with_load():
    """`PipelineConfig(...)` has the generic defaults (pipeline and model name, bars), not the
    use case's: only `PipelineConfig.load` gives what a user's run gets, so product code uses it."""
    pattern = re.compile(r"\bPipelineConfig\(")
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in _product_modules()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line) and not line.lstrip().startswith("class ")
    ]
    assert found == []


def _packages() -> list[str]:
    return sorted(
        str(init.parent.relative_to(REPO_ROOT))
        for top in ("pipelines", "components")
        for init in (REPO_ROOT / top).rglob("__init__.py")
        if init.parent.parent != REPO_ROOT  # the two top packages are the fixed layout
    )


@pytest.mark.parametrize("package", _packages())
def test_readme_layout_names_every_package(package):
    readme = (REPO_ROOT / "README.md").read_text()
    layout = readme[readme.index("## Layout") : readme.index("\n## ", readme.index("## Layout"))]
    named = re.sub(r"use_cases/[^/]+", "use_cases/<name>", package)
    assert f"`{named}/`" in layout or f"`{named}/" in layout, f"README's Layout lacks {package}/"
