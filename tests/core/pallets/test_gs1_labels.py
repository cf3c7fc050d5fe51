"""Reading GS1 label content (`core.pallets.gs1_labels`): every input form a scanner or a person
produces, real label strings (the GS1 General Specifications' SSCC 106141411234567897 and
GTIN 10614141000415 of company prefix 0614141), wrong check digits, impossible dates, unknown
AIs, and which labels a facility reads as GS1."""

from __future__ import annotations

from datetime import date

import pytest

from core.pallets import gs1_labels
from core.pallets.gs1_labels import LabelFacts, Problem
from core.pallets.readings import Label
from core.tenancy.tenants import Facility, LabelFieldMapping

SSCC = "106141411234567897"
GTIN = "10614141000415"
GLN = "0614141000012"
HUMAN = f"(00){SSCC}(02){GTIN}(37)24(10)LOT-42(17)270531(15)270430(400)PO-1001(410){GLN}"
FULL = LabelFacts(
    sscc=SSCC,
    gtin=GTIN,
    lot="LOT-42",
    expiry=date(2027, 5, 31),
    best_before=date(2027, 4, 30),
    count=24,
    customer_po="PO-1001",
    ship_to_gln=GLN,
)
# The same label as a GS1-128 scanner sends it: fixed-length fields run on, GS ends each
# variable-length one (37, 10, 400) but the last.
ELEMENTS = f"00{SSCC}02{GTIN}3724\x1d10LOT-42\x1d1727053115270430400PO-1001\x1d410{GLN}"


@pytest.mark.parametrize(
    "content",
    [
        HUMAN,
        " (00) 106141411234567897 (02) 10614141000415 (37) 24 (10) LOT-42 (17) 270531 (15) 270430"
        f" (400) PO-1001 (410) {GLN} ",
        ELEMENTS,
        f"]C1{ELEMENTS}",  # GS1-128 with its symbology identifier
        f"]d2{ELEMENTS}",  # GS1 DataMatrix
        f"\x1d{ELEMENTS}",  # a leading FNC1 as some scanners send it
        f"]Q3{ELEMENTS}",  # GS1 QR Code
    ],
)
def test_every_form_of_one_label_gives_the_same_facts(content: str):
    assert gs1_labels.parse(content) == FULL


def test_a_digital_link_uri_gives_its_primary_key_and_qualifiers():
    assert gs1_labels.parse(f"https://id.gs1.org/00/{SSCC}") == LabelFacts(sscc=SSCC)
    assert gs1_labels.parse(f"]Q1https://id.gs1.org/00/{SSCC}") == LabelFacts(sscc=SSCC)
    linked = gs1_labels.parse("https://example.com/01/09506000134352/10/ABC123?17=270600")
    assert (linked.gtin, linked.lot, linked.expiry, linked.problems) == (
        "09506000134352",
        "ABC123",
        date(2027, 6, 30),  # day 00: the last day of the month
        (),
    )


def test_the_contents_gtin_is_fourteen_digits_and_ai_01_with_02_is_a_problem():
    assert gs1_labels.parse("(01)09506000134352").gtin == "09506000134352"
    assert gs1_labels.parse(f"(02){GTIN}").gtin == GTIN
    for label in (f"(01)09506000134352(02){GTIN}", f"(02){GTIN}(01)09506000134352"):
        facts = gs1_labels.parse(label)
        assert facts.gtin is None
        assert [p.ai for p in facts.problems] == ["02"]


def test_a_wrong_sscc_check_digit_is_a_problem_and_the_rest_is_kept():
    facts = gs1_labels.parse("]C100106141411234567898\x1d10LOT-42\x1d17270531")

    assert facts.sscc is None  # a number that fails its check digit is not the pallet's
    assert (facts.lot, facts.expiry) == ("LOT-42", date(2027, 5, 31))
    assert facts.problems == (
        Problem("00", "Invalid SSCC check digit for '106141411234567898': Expected 7, got 8."),
    )
    assert facts.elements[0] == ("00", "106141411234567898")


def test_wrong_gtin_and_gln_check_digits_are_problems_of_their_ai():
    facts = gs1_labels.parse(f"(00){SSCC}(02)10614141000416(410)0614141000013")

    assert (facts.sscc, facts.gtin, facts.ship_to_gln) == (SSCC, None, None)
    assert [p.ai for p in facts.problems] == ["02", "410"]
    assert "check digit" in facts.problems[0].reason
    assert "check digit" in facts.problems[1].reason


def test_an_impossible_date_is_a_problem_of_its_ai():
    facts = gs1_labels.parse(f"(00){SSCC}(17)270230(15)271301")

    assert (facts.sscc, facts.expiry, facts.best_before) == (SSCC, None, None)
    assert [p.ai for p in facts.problems] == ["17", "15"]


def test_reading_resumes_after_the_gs_that_follows_a_broken_element():
    # AI 17 with 5 digits cannot be read; the lot after the next GS still is
    facts = gs1_labels.parse(f"00{SSCC}1727053\x1d10LOT-9")

    assert (facts.sscc, facts.lot) == (SSCC, "LOT-9")
    assert [p.ai for p in facts.problems] == ["17"]


@pytest.mark.parametrize(
    ("content", "ai"),
    [
        ("PALLET 42", ""),  # no AI at all
        ("", ""),
        ("]C1", ""),
        ("(00)", "00"),
        ("(00106141411234567897", ""),
        ("https://example.com/not-a-gs1-path", ""),
        ("]C0" + f"00{SSCC}", ""),  # plain Code 128: not GS1-128
        ("]E0" + GTIN[1:], ""),  # an EAN-13 is a product, not a logistic label
    ],
)
def test_content_that_is_no_gs1_label_is_a_problem_and_gives_no_facts(content: str, ai: str):
    facts = gs1_labels.parse(content)

    assert facts.values() == {}
    assert facts.problems
    assert facts.problems[0].ai == ai
    assert all(p.reason for p in facts.problems)


def test_facts_become_labels_with_the_confidence_of_their_label():
    facility = Facility("acme", "dc1", "DC 1")
    labels = [Label("gs1", HUMAN, 1.0), Label("sku", "OTHER", 0.5)]

    assert gs1_labels.read_labels(facility, labels).derived == (
        ("lpn", SSCC, 1.0),
        ("gtin", GTIN, 1.0),
        ("lot", "LOT-42", 1.0),
        ("expiry", "2027-05-31", 1.0),
        ("best_before", "2027-04-30", 1.0),
        ("count", "24", 1.0),
        ("customer_po", "PO-1001", 1.0),
        ("ship_to_gln", GLN, 1.0),
    )


def test_a_facility_reads_a_label_it_maps_to_gs1_as_gs1_content():
    mapped = Facility("acme", "dc1", "DC 1", label_fields=(LabelFieldMapping("barcode", "gs1"),))
    plain = Facility("acme", "dc1", "DC 1")
    labels = [Label("barcode", f"(00){SSCC}", 0.7)]

    assert gs1_labels.is_gs1(plain, "gs1")
    assert gs1_labels.is_gs1(mapped, "gs1")
    assert gs1_labels.read_labels(mapped, labels).derived == (("lpn", SSCC, 0.7),)
    assert gs1_labels.read_labels(plain, labels).derived == ()
    broken = [Label("barcode", "(00)106141411234567898", 0.7)]
    assert gs1_labels.read_labels(mapped, broken).problems == (
        Problem("00", "Invalid SSCC check digit for '106141411234567898': Expected 7, got 8."),
    )


def test_the_api_form_of_the_facts_is_camel_case_with_its_problems():
    facts = gs1_labels.parse(f"(00){SSCC}(15)270430(400)PO-1(02)10614141000416")

    assert facts.as_dict() == {
        "sscc": SSCC,
        "bestBefore": "2027-04-30",
        "customerPo": "PO-1",
        "problems": [
            {
                "ai": "02",
                "reason": "Invalid GTIN check digit for '10614141000416': Expected 5, got 6.",
            }
        ],
    }


def test_a_pathological_label_costs_bounded_problems_of_bounded_size():
    # 330 broken elements, each reason of the parser quoting the rest of the label
    facts = gs1_labels.parse(("2A\x1d" * 340)[:1024])

    assert len(facts.problems) == gs1_labels.MAX_PROBLEMS
    assert all(len(p.reason) <= gs1_labels.MAX_REASON_CHARS for p in facts.problems)
    assert len(facts.elements) <= gs1_labels.MAX_ELEMENTS
    assert facts.problems[-1].reason.startswith("and ")


def test_a_long_human_readable_label_is_read_up_to_the_element_limit():
    facts = gs1_labels.parse(f"(00){SSCC}" + "(10)x" * 100)

    assert facts.sscc == SSCC
    assert len(facts.elements) <= gs1_labels.MAX_ELEMENTS
    assert len(facts.problems) <= gs1_labels.MAX_PROBLEMS


def _digits(text: str, zero: int) -> str:
    """`text` with its ASCII digits written in another script's digits (from `zero`)."""
    return text.translate({ord("0") + d: zero + d for d in range(10)})


FULLWIDTH_ZERO, ARABIC_INDIC_ZERO = 0xFF10, 0x0660


@pytest.mark.parametrize(
    "label",
    [
        "00" + _digits(SSCC, FULLWIDTH_ZERO),
        "00" + _digits(SSCC, ARABIC_INDIC_ZERO),
        f"00{SSCC}10L\u00d6T",  # a letter outside set 82
        f"(00){SSCC}(37)" + _digits("24", FULLWIDTH_ZERO),
        f"00{SSCC}10LOT\u200b",
    ],
)
def test_characters_outside_gs1_character_set_82_refuse_the_label(label: str):
    facts = gs1_labels.parse(label)

    assert facts.values() == {}
    [problem] = facts.problems
    assert "outside GS1 character set 82" in problem.reason


def test_a_digital_link_value_outside_set_82_is_a_problem():
    facts = gs1_labels.parse(f"https://id.gs1.org/00/{SSCC}?10=L%C3%96T")

    assert (facts.sscc, facts.lot) == (SSCC, None)
    assert [p.ai for p in facts.problems] == ["10"]


def test_the_same_ai_twice_with_different_values_takes_neither():
    other = "006141411234567890"
    facts = gs1_labels.parse(f"00{SSCC}00{other}10LOT")

    assert (facts.sscc, facts.lot) == (None, "LOT")
    assert [(p.ai, p.reason) for p in facts.problems] == [
        ("00", "AI (00) appears twice with different values")
    ]
    assert gs1_labels.parse(f"00{SSCC}00{SSCC}").sscc == SSCC  # the same value twice is fine


def test_a_count_of_zero_is_a_problem():
    facts = gs1_labels.parse(f"02{GTIN}3700000000")

    assert facts.count is None
    assert [p.ai for p in facts.problems] == ["37"]


def test_one_bad_digital_link_query_attribute_loses_only_itself():
    facts = gs1_labels.parse(f"https://id.gs1.org/00/{SSCC}?17=261399&10=LOT-1")

    assert (facts.sscc, facts.lot, facts.expiry) == (SSCC, "LOT-1", None)
    assert [p.ai for p in facts.problems] == ["17"]


def test_a_digital_link_with_user_information_is_refused_any_host_is_read():
    assert gs1_labels.parse(f"https://user:pw@id.gs1.org/00/{SSCC}").sscc is None
    assert gs1_labels.parse(f"https://resolver.example:8443/00/{SSCC}").sscc == SSCC


def _gs1(*contents: str, lpn: str | None = None) -> list[Label]:
    labels = [Label("gs1", content, 0.9) for content in contents]
    return labels + ([Label("lpn", lpn, 0.8)] if lpn else [])


def test_identical_labels_of_a_reading_count_once():
    read = gs1_labels.read_labels(None, _gs1(f"00{SSCC}02{GTIN}3724", f"00{SSCC}02{GTIN}3724"))

    assert len(read.facts) == 1
    assert sorted(name for name, _, _ in read.derived) == ["count", "gtin", "lpn"]


def test_a_reading_whose_labels_name_two_ssccs_takes_neither():
    other = "006141411234567890"
    read = gs1_labels.read_labels(None, _gs1(f"00{SSCC}", f"00{other}"))

    assert [name for name, _, _ in read.derived] == []
    assert [p.ai for p in read.problems] == ["00"]
    assert "2 different SSCCs" in read.problems[0].reason


def test_a_gs1_sscc_that_differs_from_the_lpn_label_is_a_problem():
    read = gs1_labels.read_labels(None, _gs1(f"00{SSCC}10LOT", lpn="006141411234567890"))

    assert [name for name, _, _ in read.derived] == ["lot"]
    assert [p.ai for p in read.problems] == ["00"]
    agreeing = gs1_labels.read_labels(None, _gs1(f"00{SSCC}", lpn=SSCC))
    assert agreeing.problems == ()


@pytest.mark.parametrize("ai", ["001", "0212", "4100"])
def test_a_human_readable_ai_is_looked_up_whole_never_by_its_first_digits(ai: str):
    # (001) is no AI: reading it as AI (00) would take the SSCC 1 + 17 digits that follow
    facts = gs1_labels.parse(f"({ai}){SSCC[1:]}(10)LOT-1")

    assert (facts.sscc, facts.gtin, facts.ship_to_gln, facts.lot) == (None, None, None, "LOT-1")
    assert [p.ai for p in facts.problems] == [""]
    assert f"Unknown GS1 Application Identifier '{ai}'" in facts.problems[0].reason


def test_a_digital_link_attribute_is_looked_up_whole_and_other_keys_are_ignored():
    # a key that is no AI is extra data the Digital Link standard lets a resolver ignore
    facts = gs1_labels.parse(f"https://id.gs1.org/00/{SSCC}?011=0950600013435&linkType=gs1:pip")

    assert (facts.sscc, facts.gtin, facts.problems) == (SSCC, None, ())


@pytest.mark.parametrize(
    "content",
    ["]", "]\x1d", "]C", "] ", "]\x1d\x1d", "]Q", "]d2", "]C1\x1d", "]e0", "(", "()", ")("],
)
def test_content_the_parser_chokes_on_is_a_problem_never_an_exception(content: str):
    facts = gs1_labels.parse(content)
    assert facts.problems, facts
    assert facts.values() == {}


def test_a_digital_link_repeating_an_ai_in_its_query_takes_neither_value():
    facts = gs1_labels.parse(f"https://id.gs1.org/00/{SSCC}?10=A&10=B")
    assert facts.sscc == SSCC
    assert facts.lot is None
    assert [p.ai for p in facts.problems] == ["10"]
    # the same value twice is one fact, as in element strings
    assert gs1_labels.parse(f"https://id.gs1.org/00/{SSCC}?10=A&10=A").lot == "A"


@pytest.mark.parametrize("query", ["10=%ZZ%", "10=A%2", "10=%G1", "10=A&17=%"])
def test_a_digital_link_with_invalid_percent_encoding_is_refused(query: str):
    facts = gs1_labels.parse(f"https://id.gs1.org/00/{SSCC}?{query}")
    assert facts.lot is None
    assert facts.problems
    assert "percent" in facts.problems[0].reason
