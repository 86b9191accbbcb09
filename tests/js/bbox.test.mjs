// Node's built-in test runner (node --test tests/js/): the JS mirror agrees with Python on the shared fixtures.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  applyDrag, boxFromRegion, boxGeometry, boxProblems, elementsFromBoxes, hitTest, normalizeColor, pixelBoxToBbox, pyStrip,
  regionFromBox, serializeCaption,
} from "../../web/lib/bbox.mjs";
import { LIMITS } from "../../web/lib/caption_limits.mjs";
import { load } from "./fixtures.mjs";

test("limits mirror the shared limits.json", () => {
  const shared = load("limits.json");
  delete shared._comment;
  assert.deepEqual(LIMITS, shared);
});

for (const c of load("bbox_cases.json").cases) {
  test(`pixel box -> grid: ${c.note}`, () => {
    assert.deepEqual(pixelBoxToBbox(c.box, c.width, c.height), c.bbox);
  });
}

for (const c of load("box_geometry.json").cases) {
  test(`box geometry (refused / clamped, as the Python node): ${c.note}`, () => {
    const { problem, note, bbox } = boxGeometry(c.box, c.width, c.height);
    if (c.verdict === "refused") {
      assert.ok(problem && problem.includes(c.says), problem);
      assert.equal(note, null);
      return;
    }
    assert.equal(problem, null);
    assert.deepEqual(bbox, c.bbox);
    if (c.verdict === "clamped") assert.ok(note && note.includes(c.says) && note.includes(`[${c.bbox.join(", ")}]`));
    else assert.equal(note, null);
  });
}

test("frontend boxes -> elements, same bytes as the hand-written fixture", () => {
  for (const c of load("box_elements.json").cases) {
    const got = elementsFromBoxes(c.boxes, c.width, c.height);
    assert.deepEqual(got, c.elements);
    assert.equal(JSON.stringify(got), JSON.stringify(c.elements)); // key order too
  }
});

function shuffled(value) {
  if (Array.isArray(value)) return value.map(shuffled);
  if (value && typeof value === "object") {
    const keys = Object.keys(value);
    for (let i = keys.length - 1; i > 0; i--) {
      const j = Math.floor(Math.random() * (i + 1));
      [keys[i], keys[j]] = [keys[j], keys[i]];
    }
    const out = {};
    for (const k of keys) out[k] = shuffled(value[k]);
    return out;
  }
  return value;
}

for (const c of load("serialized.json").cases) {
  test(`serializer mirror matches Python's bytes: ${c.id}`, () => {
    for (let i = 0; i < 5; i++) assert.equal(serializeCaption(shuffled(c.caption)), c.serialized);
  });
}

test("the 8 examples serialize to the stdlib oracle bytes", () => {
  const serialized = new Map(load("serialized.json").cases.map((c) => [c.id, c.serialized]));
  const examples = load("examples.json").examples;
  assert.equal(examples.length, 8);
  for (const ex of examples) assert.equal(serializeCaption(ex.caption), serialized.get(ex.id));
});

test("color normalization mirrors Python", () => {
  assert.deepEqual(normalizeColor("#c8a27a"), ["#C8A27A", true]);
  assert.deepEqual(normalizeColor(" fff "), ["#FFFFFF", true]);
  assert.deepEqual(normalizeColor("#2B1D14"), ["#2B1D14", false]);
  assert.deepEqual(normalizeColor("#11223344"), ["#11223344", false]); // translucent: left for validation
  assert.deepEqual(normalizeColor("#112233FF"), ["#112233", true]);
  assert.deepEqual(normalizeColor("red"), ["red", false]);
  assert.equal(pyStrip("\u001f a \u0085"), "a");
  assert.equal(pyStrip("\ufeffa"), "\ufeffa"); // Python's strip keeps the BOM
});

test("box problems flag what the validator will refuse", () => {
  const ok = { x: 0, y: 0, width: 10, height: 10, metadata: { type: "text", text: "HI", desc: "sign", palette: [] } };
  assert.deepEqual(boxProblems(ok), []);
  const bad = { ...ok, metadata: { type: "text", text: " ", desc: "", palette: ["#1", "#2", "#3", "#4", "#5", "#6"] } };
  const problems = boxProblems(bad);
  assert.ok(problems.includes("text is empty"));
  assert.ok(problems.includes("desc is empty"));
  assert.ok(problems.some((p) => p.startsWith("6 colors; at most 5")));
  assert.equal(problems.filter((p) => p.includes("is not #RRGGBB")).length, 6);
});

test("region <-> frontend box round trip keeps the grid coordinates", () => {
  const W = 1536, H = 864;
  for (let i = 0; i < 200; i++) {
    const x = Math.floor(Math.random() * W), y = Math.floor(Math.random() * H);
    const box = { x, y, width: Math.floor(Math.random() * (W - x)), height: Math.floor(Math.random() * (H - y)),
      metadata: { type: "obj", text: "", desc: "d", palette: [] } };
    const back = boxFromRegion(regionFromBox(box, W, H), W, H);
    assert.deepEqual(back, box);
    assert.deepEqual(pixelBoxToBbox(back, W, H), pixelBoxToBbox(box, W, H));
  }
});

test("drag math: move stays inside, resize normalizes flipped boxes", () => {
  const r = { x: 0.5, y: 0.5, w: 0.25, h: 0.25, type: "obj", text: "", desc: "", palette: [] };
  const moved = applyDrag("move", r, 0.5, -0.9);
  assert.equal(moved.x, 0.75);
  assert.equal(moved.y, 0);
  const flipped = applyDrag("resize-br", r, -0.5, 0);
  assert.ok(Math.abs(flipped.x - 0.25) < 1e-12 && Math.abs(flipped.w - 0.25) < 1e-12);
  const drawn = applyDrag("draw", { ...r, w: 0, h: 0 }, 0.9, 0.9);
  assert.equal(drawn.x + drawn.w, 1); // clamped to the canvas
  assert.equal(drawn.y + drawn.h, 1);
  const left = applyDrag("resize-l", r, 0.1, 0);
  assert.ok(Math.abs(left.x - 0.6) < 1e-12 && Math.abs(left.w - 0.15) < 1e-12);
});

test("hit testing: corners resize, inside moves, the top box wins, outside misses", () => {
  const a = { x: 0.1, y: 0.1, w: 0.5, h: 0.5 };
  const b = { x: 0.3, y: 0.3, w: 0.5, h: 0.5 };
  assert.deepEqual(hitTest([a, b], 0.4, 0.4, 0.01, 0.01), { index: 1, mode: "move" });
  assert.deepEqual(hitTest([a, b], 0.4, 0.4, 0.01, 0.01, 0), { index: 0, mode: "move" });
  assert.deepEqual(hitTest([a, b], 0.1, 0.1, 0.01, 0.01), { index: 0, mode: "resize-tl" });
  assert.deepEqual(hitTest([a, b], 0.8, 0.55, 0.01, 0.01), { index: 1, mode: "resize-r" });
  assert.equal(hitTest([a, b], 0.95, 0.05, 0.01, 0.01), null);
});
