"""A GraphQL client that is not ours (graphql-core) reads the ledger's schema.

Usage: introspect.py URL TOKEN README

Sends graphql-core's standard introspection query (its defaults, then with every option on) to
URL/graphql with the bearer TOKEN, builds a client schema from each answer
(`build_client_schema`), checks that it agrees with the SDL served at
URL/graphql/schema.graphql, and validates every ```graphql block of README against it. Prints
one line per check; exits non-zero at the first failure.
"""

import json
import re
import sys
import urllib.request

from graphql import (
    build_client_schema,
    build_schema,
    get_introspection_query,
    parse,
    validate,
)


def post(url, token, query):
    body = json.dumps({"query": query, "operationName": "IntrospectionQuery"}).encode()
    request = urllib.request.Request(
        url + "/graphql",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + token},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def fields_of(schema):
    """Every type's fields (and input fields), by name: what a client generates code from.
    The built-in scalars are left out: introspection lists them all, SDL only those used."""
    shape = {}
    for name, t in schema.type_map.items():
        if name.startswith("__") or name in ("Int", "Float", "String", "Boolean", "ID"):
            continue
        shape[name] = sorted(getattr(t, "fields", {}) or {})
    return shape


def main():
    url, token, readme = sys.argv[1], sys.argv[2], sys.argv[3]
    options = [
        ("defaults", {}),
        (
            "every option",
            dict(
                descriptions=True,
                specified_by_url=True,
                directive_is_repeatable=True,
                schema_description=True,
                input_value_deprecation=True,
            ),
        ),
    ]
    schema = None
    for label, kwargs in options:
        answer = post(url, token, get_introspection_query(**kwargs))
        if answer.get("errors"):
            fail(f"introspection ({label}) refused: {answer['errors']}")
        schema = build_client_schema(answer["data"])
        print(f"ok: introspection ({label}): {len(schema.type_map)} types")

    with urllib.request.urlopen(url + "/graphql/schema.graphql", timeout=30) as response:
        sdl = response.read().decode()
    from_sdl = build_schema(sdl)
    a, b = fields_of(from_sdl), fields_of(schema)
    if a != b:
        diff = {n: (a.get(n), b.get(n)) for n in set(a) | set(b) if a.get(n) != b.get(n)}
        fail(f"the SDL and the introspected schema disagree (SDL, introspection): {diff}")
    print("ok: the SDL agrees with introspection")

    text = open(readme, encoding="utf-8").read()
    blocks = re.findall(r"```graphql\n(.*?)```", text, re.S)
    if not blocks:
        fail("README has no graphql example")
    for block in blocks:
        errors = validate(schema, parse(block))
        if errors:
            fail(f"README example does not validate: {errors}\n{block}")
    print(f"ok: {len(blocks)} README examples validate")


if __name__ == "__main__":
    main()
