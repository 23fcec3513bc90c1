"""bench_structured's requests: hand-written documents (no built-in workload uses the text), each
with the JSON schema to extract it into (strings at most 60 characters, arrays at most 6 items)."""

from __future__ import annotations

from typing import Any

DOCS: list[tuple[str, dict[str, Any]]] = [
    (
        "Invoice 2291 from Harbour Lane Bakery, dated 14 March, to Clifftop Guest House: forty "
        "sourdough loaves at 3.20 each and twelve rye loaves at 2.80 each. Payment due within "
        "fourteen days to the account of Harbour Lane Bakery.",
        {
            "type": "object",
            "properties": {
                "invoice_number": {"type": "integer"},
                "seller": {"type": "string", "maxLength": 60},
                "buyer": {"type": "string", "maxLength": 60},
                "date": {"type": "string", "maxLength": 60},
                "items": {
                    "type": "array",
                    "maxItems": 6,
                    "items": {
                        "type": "object",
                        "properties": {
                            "product": {"type": "string", "maxLength": 60},
                            "quantity": {"type": "integer"},
                            "unit_price": {"type": "number"},
                        },
                        "required": ["product", "quantity", "unit_price"],
                        "additionalProperties": False,
                    },
                },
                "payment_days": {"type": "integer"},
            },
            "required": ["invoice_number", "seller", "buyer", "date", "items", "payment_days"],
            "additionalProperties": False,
        },
    ),
    (
        "Minutes of the Ferndale Allotment Society, 2 June. Present: Margaret Oyelaran (chair), "
        "Tomasz Wierzbicki (treasurer), Ines Carvalho. The treasurer reported a balance of 412 "
        "pounds. Agreed: replace the north gate lock before July; Ines Carvalho to order two "
        "water butts. Next meeting: 7 July at the pavilion.",
        {
            "type": "object",
            "properties": {
                "organisation": {"type": "string", "maxLength": 60},
                "date": {"type": "string", "maxLength": 60},
                "attendees": {
                    "type": "array",
                    "maxItems": 6,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "maxLength": 60},
                            "role": {"enum": ["chair", "treasurer", "member"]},
                        },
                        "required": ["name", "role"],
                        "additionalProperties": False,
                    },
                },
                "balance_pounds": {"type": "integer"},
                "actions": {
                    "type": "array",
                    "maxItems": 6,
                    "items": {"type": "string", "maxLength": 60},
                },
                "next_meeting": {"type": "string", "maxLength": 60},
            },
            "required": [
                "organisation",
                "date",
                "attendees",
                "balance_pounds",
                "actions",
                "next_meeting",
            ],
            "additionalProperties": False,
        },
    ),
    (
        "Bug report from Priya Natarajan: the export button in the Ledgerly desktop app, "
        "version 4.7.1 on Windows 11, freezes the window when the report has more than 10,000 "
        "rows. Expected a CSV file; got no response for two minutes. Severity: high. "
        "Reproducible every time.",
        {
            "type": "object",
            "properties": {
                "reporter": {"type": "string", "maxLength": 60},
                "product": {"type": "string", "maxLength": 60},
                "version": {"type": "string", "maxLength": 60},
                "platform": {"type": "string", "maxLength": 60},
                "summary": {"type": "string", "maxLength": 60},
                "expected": {"type": "string", "maxLength": 60},
                "actual": {"type": "string", "maxLength": 60},
                "severity": {"enum": ["low", "medium", "high", "critical"]},
                "reproducible": {"type": "boolean"},
            },
            "required": [
                "reporter",
                "product",
                "version",
                "platform",
                "summary",
                "expected",
                "actual",
                "severity",
                "reproducible",
            ],
            "additionalProperties": False,
        },
    ),
    (
        "Recipe: Barley and leek broth for four. Ingredients: 2 leeks, 100 g pearl barley, "
        "1 carrot, 1.2 litres vegetable stock, a bay leaf. Sweat the leeks and carrot for ten "
        "minutes, add barley, stock and bay leaf, simmer for forty minutes. Vegetarian.",
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "maxLength": 60},
                "servings": {"type": "integer"},
                "ingredients": {
                    "type": "array",
                    "maxItems": 6,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": {"type": "string", "maxLength": 60},
                            "amount": {"type": "string", "maxLength": 60},
                        },
                        "required": ["name", "amount"],
                        "additionalProperties": False,
                    },
                },
                "total_minutes": {"type": "integer"},
                "vegetarian": {"type": "boolean"},
            },
            "required": ["title", "servings", "ingredients", "total_minutes", "vegetarian"],
            "additionalProperties": False,
        },
    ),
]
