// The course's search ranking (Sphinx embeds this file as `Scorer`; its defaults are kept below).
// Sphinx's index knows which words a page has, not how often nor where, so its scores tie and ties go by kind and
// name. site/build_site.py appends `Scorer.pages`: for each page, its title, its headings and its text (lower
// case, words only), and a page is ranked by where the query's words stand, whatever its kind (lesson, exercise,
// reference): the whole query in the title, then in a heading, then how often in the text; then each word the
// same way. The page that teaches a concept names it in its title or a heading, and says it often.
var Scorer = {
  score: (result) => {
    const [docname, title, anchor, descr, score, filename, kind] = result;
    const page = (Scorer.pages || {})[docname];
    if (!page) return score;
    const query = new URLSearchParams(window.location.search).get("q") || "";
    const words = query.toLowerCase().split(/[^a-z0-9]+/).filter((w) => w.length > 1);
    if (!words.length) return score;
    const phrase = words.join(" ");
    // occurrences of `text` at the start of a word (so "cach" counts "cache" and "caching")
    const count = (haystack, text) => {
      let n = 0;
      for (let i = haystack.indexOf(text); i !== -1; i = haystack.indexOf(text, i + text.length)) {
        if (i === 0 || haystack[i - 1] === " " || haystack[i - 1] === "\n") n += 1;
      }
      return n;
    };
    const headings = page.h.split("\n");
    const inHeadings = (text) => headings.filter((h) => count(h, text) > 0).length;
    let rank = 0;
    if (words.length > 1) {
      rank += 40 * (count(page.t, phrase) > 0) + 12 * Math.min(3, inHeadings(phrase))
        + 6 * Math.log2(1 + count(page.b, phrase));
    }
    for (const w of words) {
      rank += 12 * (count(page.t, w) > 0) + 3 * Math.min(3, inHeadings(w)) + 2 * Math.log2(1 + count(page.b, w));
    }
    // a page's results stay together, ranked by the page; among them Sphinx's own order (a matching section first)
    return Math.round(rank * 100) + score;
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
