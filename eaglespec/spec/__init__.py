"""Speculation: draft heads, drafting strategies, tree data, verification and sampling."""
