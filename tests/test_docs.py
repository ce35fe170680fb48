"""The docs site: the scenario reference is generated from the validation model and documents every key
the code accepts with the default the code has; every page is in the site's navigation."""

from __future__ import annotations

import re
import sys

from agentload.run.scenario import SECTIONS, Scenario, load_scenario
from agentload.validate import checks_of
from helpers import REPO

sys.path.insert(0, str(REPO / "tools"))
import scenario_reference  # noqa: E402


def test_the_reference_documents_every_key_of_every_section():
    keys = set(scenario_reference.every_key())
    for section in SECTIONS:
        cls = type(getattr(Scenario(source="x"), section))
        for name in checks_of(cls):
            assert f"{section}.{name}" in keys, f"{section}.{name} missing from the scenario reference"
    for name in ("at_s", "backend", "fault", "for_s"):
        assert f"schedule.{name}" in keys
    assert "mock.stall_mid_stream.after_tokens" in keys and "fleet.backends[].role" in keys
    assert len(keys) == len(scenario_reference.every_key())  # each key once


def test_every_default_the_reference_shows_is_the_codes(tmp_path):
    # Setting a key to the default the page shows leaves the scenario as it was: the page shows
    # the real keys with their real defaults, in the form --set and the TOML file take.
    empty = tmp_path / "empty.toml"
    empty.write_text("")
    base = load_scenario(str(empty)).to_dict()
    checked = 0
    for title, _, keys in scenario_reference.sections():
        if title.startswith("[["):  # a list of tables: set whole, not key by key
            continue
        for k in keys:
            # a key of a table inside a table needs that table's other keys: left to the walk test
            if k.default in ("left out", "required") or k.key.count(".") != 1:
                continue
            assert load_scenario(str(empty), [f"{k.key}={k.default}"]).to_dict() == base, k
            checked += 1
    assert checked > 60


def test_the_reference_carries_what_the_source_says_beside_a_field():
    page = scenario_reference.render()
    row = next(line for line in page.splitlines() if line.startswith("| `client.limit` |"))
    assert "`100`" in row and "aiohttp TCPConnector(limit); 0 = unlimited" in row
    row = next(line for line in page.splitlines() if line.startswith("| `target.endpoint` |"))
    assert "left out: start the embedded mock server" in row  # Python's None said as a reader reads it
    # a group label above a field is not that field's description
    row = next(line for line in page.splitlines() if line.startswith("| `mock.hang_above_tokens` |"))
    assert "faults" not in row
    assert "## `[[schedule]]`" in page and "## `[cluster]`" in page


def test_every_docs_page_is_in_the_navigation_and_every_nav_entry_exists():
    import mkdocs_hooks  # tools/: the pages the site generates

    nav = re.findall(r"^  - [^:]+: (\S+\.md)$", (REPO / "mkdocs.yml").read_text(), flags=re.M)
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    generated = set(mkdocs_hooks.GENERATED)
    assert scenario_reference.PAGE in generated and not generated & pages  # generated at build, never written
    assert set(nav) == pages | generated, set(nav) ^ (pages | generated)
    assert mkdocs_hooks.GENERATED["changelog.md"]() == (REPO / "CHANGELOG.md").read_text()


def test_the_readme_stays_short_and_links_pages_that_exist():
    readme = (REPO / "README.md").read_text()
    assert len(readme.encode()) < 12_000
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (REPO / link).exists(), link



def test_the_readmes_scenario_excerpt_is_a_scenario(tmp_path):
    readme = (REPO / "README.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", readme, flags=re.S)
    path = tmp_path / "excerpt.toml"
    path.write_text(block)
    sc = load_scenario(str(path))
    assert (sc.agents.count, sc.stall.after_s, sc.mock.hang_above_tokens) == (12, 2.0, 6000)
    packaged = load_scenario("long-context-hang")  # the excerpt says it is taken from there
    assert (packaged.agents.count, packaged.stall.after_s, packaged.mock.hang_above_tokens) == (12, 2.0, 6000)
