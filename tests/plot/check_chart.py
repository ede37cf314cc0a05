"""Checks a rendering of one of ddp_plot's charts against the SVG it came from.

  check_chart.py SVG PNG [--dom DOM] --label LABEL [--label LABEL ...]

SVG: the chart ddp_plot wrote. PNG: a rendering of it at any scale (headless
Chromium's screenshot, or ddp_plot's own PNG). DOM: Chromium's --dump-dom of
the SVG. Passes (exit 0) when
  - the legend names exactly the labels given, in order, as <text>, in the SVG
    and in the browser's DOM;
  - the image is not blank: enough pixels differ from the white ground;
  - each legend entry's swatch is drawn in its colour where the SVG puts it;
  - each entry's colour also covers pixels inside the plotting areas (its
    curves or bars, not only its swatch).
Anything else prints why and exits 1.
"""
import argparse
import sys
import xml.etree.ElementTree as ET

import numpy as np
from PIL import Image

SVG_NS = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print(f"check_chart: FAIL: {msg}")
    sys.exit(1)


def classes(el):
    return el.get("class", "").split()


def find_class(root, cls):
    return [el for el in root.iter() if cls in classes(el)]


def legend_entries(root, where):
    legends = find_class(root, "legend")
    if len(legends) != 1:
        fail(f"{where}: {len(legends)} legend groups, expected 1")
    entries = []
    for item in find_class(legends[0], "legend-item"):
        texts = [t for t in item.iter(f"{SVG_NS}text") if "legend-label" in classes(t)]
        swatches = find_class(item, "swatch")
        if len(texts) != 1 or len(swatches) != 1:
            fail(f"{where}: legend entry {item.get('data-label')!r} has {len(texts)} labels, {len(swatches)} swatches")
        entries.append((texts[0].text or "", swatches[0]))
    return entries


def rgb(hex_colour):
    h = hex_colour.lstrip("#")
    return np.array([int(h[i:i + 2], 16) for i in (0, 2, 4)], dtype=float)


def near(img, colour, tol=40.0):
    """Mask of pixels within tol (Euclidean, RGB) of colour."""
    return np.sqrt(((img - colour) ** 2).sum(axis=2)) <= tol


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("svg")
    ap.add_argument("png")
    ap.add_argument("--dom")
    ap.add_argument("--label", action="append", required=True)
    a = ap.parse_args()

    root = ET.parse(a.svg).getroot()
    width, height = float(root.get("width")), float(root.get("height"))
    entries = legend_entries(root, a.svg)
    labels = [text for text, _ in entries]
    if labels != a.label:
        fail(f"{a.svg}: legend labels {labels}, expected {a.label}")
    if a.dom:
        dom_labels = [text for text, _ in legend_entries(ET.parse(a.dom).getroot(), a.dom)]
        if dom_labels != a.label:
            fail(f"{a.dom}: the browser's legend labels are {dom_labels}, expected {a.label}")

    img = np.asarray(Image.open(a.png).convert("RGB"), dtype=float)
    h, w, _ = img.shape
    scale = w / width
    if abs(h - height * scale) > 2:
        fail(f"{a.png}: {w}x{h} is not the SVG's {width:g}x{height:g} at scale {scale:g}")
    ink = (np.abs(img - 255).max(axis=2) > 30).mean()
    if ink < 0.01:
        fail(f"{a.png}: nearly blank, {100 * ink:.2f}% of pixels differ from white")

    areas = find_class(root, "plot-area")
    if not areas:
        fail(f"{a.svg}: no plotting areas")
    in_areas = np.zeros((h, w), dtype=bool)
    for r in areas:
        x0, y0 = float(r.get("x")) * scale, float(r.get("y")) * scale
        x1, y1 = x0 + float(r.get("width")) * scale, y0 + float(r.get("height")) * scale
        in_areas[int(y0) + 2:int(y1) - 2, int(x0) + 2:int(x1) - 2] = True

    report = []
    for label, sw in entries:
        colour = rgb(sw.get("fill"))
        if sw.tag == f"{SVG_NS}circle":
            cx, cy = float(sw.get("cx")), float(sw.get("cy"))
        else:
            cx = float(sw.get("x")) + float(sw.get("width")) / 2
            cy = float(sw.get("y")) + float(sw.get("height")) / 2
        px, py = int(round(cx * scale)), int(round(cy * scale))
        r = max(1, int(scale))
        if not near(img[py - r:py + r + 1, px - r:px + r + 1], colour).any():
            got = img[py, px].astype(int).tolist()
            fail(f"{a.png}: legend swatch of {label!r} at ({px}, {py}) is {got}, not {sw.get('fill')}")
        drawn = int((near(img, colour) & in_areas).sum())
        if drawn < 30 * scale * scale:
            fail(f"{a.png}: only {drawn} pixels of {label!r}'s colour {sw.get('fill')} in the plotting areas")
        report.append(f"{label}: {drawn} px")
    print(f"check_chart: ok: {a.png} ({w}x{h}, {100 * ink:.1f}% ink; {', '.join(report)})")


if __name__ == "__main__":
    main()
