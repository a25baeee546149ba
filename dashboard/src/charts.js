// Line charts over steps (uPlot). A chart keeps its uPlot instance and is
// updated in place with setData, so a live job's page does not flicker.

import uPlot from "uplot";

const COLORS = [
  "#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c",
  "#0891b2", "#ca8a04", "#db2777", "#4b5563", "#65a30d",
];

export class StepChart {
  // series: [{label, dash?}], in the order of the y arrays given to update().
  // steps: an integer x axis; yRange: a fixed [min, max] (else auto).
  constructor(parent, { title, name, yLabel, xLabel = "step", steps = true, yRange = null }) {
    this.box = document.createElement("div");
    this.box.className = "chart";
    this.box.dataset.chart = name;
    parent.append(this.box);
    this.title = title;
    this.yLabel = yLabel;
    this.xLabel = xLabel;
    this.steps = steps;
    this.yRange = yRange;
    this.plot = null;
    this.labels = [];
  }

  // The grid cell's width: charts fill their column and follow the window.
  width() {
    return Math.max(260, this.box.clientWidth - 10);
  }

  // xs: numbers; ys: [{label, values (null = no point), dash?}]
  update(xs, ys) {
    const labels = ys.map((s) => s.label);
    const data = [xs, ...ys.map((s) => s.values)];
    this.box.dataset.points = String(xs.length);
    this.box.dataset.series = labels.join("|");
    if (this.plot && labels.join("|") === this.labels.join("|")) {
      this.plot.setData(data);
      return;
    }
    this.plot?.destroy();
    this.labels = labels;
    const opts = {
      title: this.title,
      width: this.width(),
      height: 220,
      scales: {
        x: { time: false },
        y: this.yRange ? { range: this.yRange } : {},
      },
      axes: [
        this.steps
          ? { label: this.xLabel, incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000] }
          : { label: this.xLabel },
        { label: this.yLabel },
      ],
      series: [
        { label: this.xLabel },
        ...ys.map((s, i) => ({
          label: s.label,
          stroke: COLORS[i % COLORS.length],
          width: 2,
          dash: s.dash,
          spanGaps: true,
          points: { show: true, size: 5 },
        })),
      ],
    };
    this.plot = new uPlot(opts, data, this.box);
  }
}

export function destroyAll(charts) {
  for (const c of Object.values(charts)) c.plot?.destroy();
}
