#!/usr/bin/env python3
"""The verdict of Tools/sync-e2e.sh, computed from the server's record against what was asked.

Inputs (in the work directory the script gives):
  asked.jsonl   every change the script asked the client to make, in the order it asked:
                {"kind": "create"|"edit", "localId", "title", "body", "phase"} — each body is
                unique, so an applied change is told by the note body the server recorded;
                {"kind": "fix", "localId", "body", "title"} — the user changed that change's title.
  events.jsonl  what the script did and when: {"event": "online", "t": ms}, and
                {"event": "read", "file": path, "asked": n} — a read done after a push that
                succeeded, when the first n asked changes had been asked.
  server/record.jsonl   the server's own record (notes-server).

It never trusts what the client reports about the server: lost, applied twice, out of order and
stale are all read off the server's record and the reads' output.
"""
import json
import sys
from collections import defaultdict


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    work, kills, outages = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    asked_all = lines(f"{work}/asked.jsonl")
    events = lines(f"{work}/events.jsonl")
    record = lines(f"{work}/server/record.jsonl")
    changes = [a for a in asked_all if a["kind"] in ("create", "edit")]
    by_body = {c["body"]: c for c in changes}
    if len(by_body) != len(changes):
        print("check: two asked changes share a body; the check cannot tell them apart", file=sys.stderr)
        return 2
    # Each local note's changes in the order they were asked: the order the server must apply them in.
    order = defaultdict(list)
    for c in changes:
        order[c["localId"]].append(c["body"])

    applied = [r for r in record if r["outcome"] == "applied"]
    applied_by_body = defaultdict(list)
    applied_by_key = defaultdict(int)
    for r in applied:
        applied_by_body[r["note"]["body"]].append(r)
        applied_by_key[r["key"]] += 1

    # The server id of each local note: the note its create was applied to.
    server_id = {}
    for c in changes:
        if c["kind"] == "create" and applied_by_body.get(c["body"]):
            server_id[c["localId"]] = applied_by_body[c["body"]][0]["note"]["id"]

    problems = []

    # Lost: an asked change never applied to its note.
    lost = 0
    for c in changes:
        rs = applied_by_body.get(c["body"], [])
        sid = server_id.get(c["localId"])
        if not rs or sid is None or not any(r["note"]["id"] == sid for r in rs):
            lost += 1
            problems.append(f"lost: {c['kind']} of {c['localId']} ({c['body']})")

    # Applied twice: a key applied more than once, or one change's effect applied more than once
    # (under two keys: a retry that did not carry the first attempt's key).
    twice = sum(1 for n in applied_by_key.values() if n > 1)
    for body, rs in applied_by_body.items():
        if len(rs) > 1:
            twice += 1
            problems.append(f"applied {len(rs)} times: {body} (keys {[r['key'] for r in rs]})")
    unknown = [r for r in applied if r["note"]["body"] not in by_body]
    for r in unknown:
        problems.append(f"applied but never asked: {r['method']} {r['path']} {r['note']}")

    # Out of order: per server note, the changes applied must follow the order they were asked in,
    # and the revisions the server received must increase.
    out_of_order = 0
    per_note = defaultdict(list)
    for r in applied:
        per_note[r["note"]["id"]].append(r)
    for sid, rs in per_note.items():
        last_index, last_revision = -1, -1
        for r in rs:
            c = by_body.get(r["note"]["body"])
            if c is None:
                continue
            index = order[c["localId"]].index(c["body"])
            if index <= last_index or r["note"]["revision"] <= last_revision:
                out_of_order += 1
                problems.append(f"out of order on {sid}: {c['body']} (revision {r['note']['revision']}) after revision {last_revision}")
            last_index = max(last_index, index)
            last_revision = max(last_revision, r["note"]["revision"])

    # Stale reads: a read after a successful push that does not show every change asked before it.
    stale = 0
    reads = 0
    for e in events:
        if e["event"] != "read":
            continue
        reads += 1
        with open(e["file"]) as f:
            out = json.loads(f.read().strip().splitlines()[-1])
        shown = {n["id"]: n for n in out["notes"]}
        latest = {}
        for c in changes[: e["asked"]]:
            latest[c["localId"]] = c["body"]
        for local, body in latest.items():
            sid = server_id.get(local)
            note = shown.get(sid) if sid else None
            if note is None or note["body"] != body:
                stale += 1
                problems.append(f"stale read {e['file']}: {local} shows {note['body'] if note else None}, asked {body}")

    # Offline: every change queued while offline applied within 2 s after the network came back.
    online = [e for e in events if e["event"] == "online"]
    offline_report = None
    late = 0
    if online:
        t_online = online[0]["t"]
        queued = [c for c in changes if c.get("phase") == "offline"]
        delays = []
        for c in queued:
            rs = applied_by_body.get(c["body"], [])
            if rs:
                delays.append(rs[0]["time"] - t_online)
        early = sum(1 for d in delays if d < 0)
        late = sum(1 for d in delays if d > 2000) + early
        worst = max(delays) if delays else float("nan")
        offline_report = (
            f"offline: all {len(delays)}/{len(queued)} changes queued offline applied within "
            f"{worst:.0f} ms after coming online (limit 2000 ms; {early} applied while offline)"
        )
        print(offline_report)

    # Dependent edits: edits of notes created offline, applied under the id the server gave the note.
    dependent = [c for c in changes if c["kind"] == "edit" and c.get("phase") == "offline"]
    under_server_id = 0
    for c in dependent:
        sid = server_id.get(c["localId"])
        if sid and any(r["path"] == f"/notes/{sid}" for r in applied_by_body.get(c["body"], [])):
            under_server_id += 1
    print(f"dependent edits: {under_server_id}/{len(dependent)} reached the server under the server's id")

    # Kills that landed while the server held the answer to a change it had applied (it waits
    # delayMs after the apply and its record): the client died not knowing the change was made.
    kill_events = [e for e in events if e["event"] == "kill"]
    mid_request = 0
    for e in kill_events:
        if any(e["t"] - e["delayMs"] <= r["time"] <= e["t"] for r in applied):
            mid_request += 1
    if kill_events:
        print(
            f"kills: {len(kill_events)} kill -9 of a syncing client, {mid_request} of them while the server "
            f"held the answer to a change it had applied"
        )

    deduplicated = sum(1 for r in record if r["outcome"] == "deduplicated")
    injected = sum(1 for r in record if r["status"] == 500)
    refused = sum(1 for r in record if r["outcome"] == "rejected")
    print(
        f"server record: {len(record)} requests, {len(applied)} applied, {deduplicated} deduplicated, "
        f"{injected} injected 500s, {refused} refused, {reads} reads checked"
    )
    for p in problems[:30]:
        print("  " + p)
    print(
        f"sync e2e: {len(changes)} changes, {kills} kills, {outages} outages, {lost} lost, "
        f"{twice} applied twice, {out_of_order} out of order, {stale} stale reads after push"
    )
    ok = (
        lost == 0 and twice == 0 and out_of_order == 0 and stale == 0 and kills >= 20 and not unknown
        and late == 0 and under_server_id == len(dependent) and len(dependent) > 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
