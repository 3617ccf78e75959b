// The course's search ranking (Sphinx embeds this file as `Scorer`; its defaults are kept below).
// Sphinx's index knows which words a page has, not how often, so many pages tie and ties go alphabetically
// ("Cheat sheet" before "Lesson 3"). Two tie-breakers that follow how the course is laid out:
// - a page whose file is named after every word of the query comes first ("ring buffer" -> 03_ring_buffer):
//   lessons and exercises are named after their concept;
// - at an equal score, a lesson before an exercise or a reference page: the lesson is where it is taught.
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename, kind] = result;
    const query = new URLSearchParams(window.location.search).get("q") || "";
    const words = query.toLowerCase().split(/[^a-z0-9]+/).filter((w) => w.length > 1);
    const name = docname.split("/").pop().toLowerCase();
    const named = words.length > 0 && words.every((w) => name.includes(w));
    return score + (named ? 10 : 0) + (docname.startsWith("notebooks/") ? 1 : 0);
  },

  // Sphinx's defaults (sphinx/themes/basic/static/searchtools.js)
  objNameMatch: 11,
  objPartialMatch: 6,
  objPrio: { 0: 15, 1: 5, 2: -5 },
  objPrioDefault: 0,
  title: 15,
  partialTitle: 7,
  term: 5,
  partialTerm: 2,
};
