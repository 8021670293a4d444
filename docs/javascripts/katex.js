// Render the equations that pymdownx.arithmatex marks (\( \) inline, \[ \] display) with the
// vendored KaTeX (docs/assets/katex): no network needed. Re-run on Material's instant navigation.
function renderMath(root) {
  root.querySelectorAll(".arithmatex").forEach(function (el) {
    renderMathInElement(el, {
      delimiters: [
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(function () { renderMath(document.body); });
} else {
  document.addEventListener("DOMContentLoaded", function () { renderMath(document.body); });
}
