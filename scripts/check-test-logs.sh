#!/usr/bin/env bash
# No secret in any log of a test run: every token, credential and Postgres password the tests
# made (e2e's write_secret and TestPg record them in target/test-secrets.txt) is looked for in
# every test's output (stdout and stderr, the binaries' logs included: nextest's JUnit report
# keeps them, passing tests' too). A hit fails the run, naming the test, never the secret.
set -euo pipefail
cd "$(dirname "$0")/.."
secrets=target/test-secrets.txt
report=target/nextest/default/junit.xml
[ -s "$report" ] || { echo "check-test-logs: no test report at $report (run the tests with nextest first)" >&2; exit 1; }
[ -s "$secrets" ] || { echo "check-test-logs: no secrets recorded in $secrets: nothing made one?" >&2; exit 1; }
python3 - "$secrets" "$report" <<'PY'
import sys, xml.etree.ElementTree as ET
secrets = sorted({l.strip() for l in open(sys.argv[1], encoding="utf-8", errors="replace") if len(l.strip()) >= 8})
root = ET.parse(sys.argv[2]).getroot()
hits, outputs = [], 0
for case in root.iter("testcase"):
    text = "".join(e.text or "" for e in case.iter() if e.tag in ("system-out", "system-err", "failure", "error"))
    outputs += len(text)
    for i, s in enumerate(secrets):
        if s in text:
            hits.append(f"{case.get('classname')}::{case.get('name')} (secret #{i + 1})")
if hits:
    print("check-test-logs: a secret appears in the output of:", *hits, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print(f"check-test-logs: none of {len(secrets)} secrets in {outputs} characters of test output")
PY
