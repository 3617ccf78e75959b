// Each figure of a notebook's output opens full size in a new tab on a click (a phone shows it shrunk to the column).
document.addEventListener("DOMContentLoaded", () => {
  for (const img of document.querySelectorAll(".bd-article .cell_output img")) {
    if (img.closest("a")) continue;
    const link = document.createElement("a");
    link.href = img.getAttribute("src");
    link.className = "swkv-full";
    link.target = "_blank";
    link.title = "Open the figure full size";
    img.replaceWith(link);
    link.appendChild(img);
  }
});
