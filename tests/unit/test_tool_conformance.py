"""Every chat template x tool parser pair of benchmarks/tool_conformance.py conforms: the call comes back parsed,
the next call's prompt keeps the sampled tokens exactly, a call cut at the token budget is not executed; and
docs/agents.md shows the table as it is measured now."""

from pathlib import Path

from benchmarks import tool_conformance

DOC = Path(__file__).resolve().parents[2] / "docs/agents.md"


def test_every_template_and_parser_pair_conforms_and_the_docs_table_is_current():
    results = tool_conformance.run_all()
    assert [r for r in results if not r.conforms] == []
    assert len(results) == len(tool_conformance.TEMPLATES) * len(tool_conformance.PARSERS)
    assert tool_conformance.table(results) in DOC.read_text(), (
        "docs/agents.md's conformance table is out of date: paste `python benchmarks/tool_conformance.py`"
    )
