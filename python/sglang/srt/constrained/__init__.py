"""Grammar-constrained decoding: json_schema, regex, ebnf and structural_tag through xgrammar or llguidance."""
