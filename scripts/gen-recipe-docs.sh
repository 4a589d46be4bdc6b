#!/usr/bin/env bash
# Regenerates the "Keys" table of recipes/README.md from the schema in code
# (lib/dstrain/config/schema.cpp). A unit test fails when the two differ.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
doc="$DSTRAIN_ROOT/recipes/README.md"
table="$("$DSTRAIN_BUILD_DIR/dstrain" schema)"
python3 - "$doc" "$table" <<'PY'
import sys
path, table = sys.argv[1], sys.argv[2]
text = open(path).read()
begin, end = "<!-- keys:begin -->\n", "<!-- keys:end -->"
a, b = text.index(begin) + len(begin), text.index(end)
open(path, "w").write(text[:a] + table.rstrip("\n") + "\n" + text[b:])
PY
echo "updated $doc"
