// The course's search ranking (Sphinx embeds this file as `Scorer`; its defaults are kept below).
// Sphinx's index knows which words a page has, not how often nor where, so its scores tie and ties go by kind and
// name. site/build_site.py appends `Scorer.pages` (for each page its title, headings and text, lower case, words
// only) and `Scorer.order` (the course's path: each lesson, then the exercises it sets). A page is ranked by where
// the query stands in it, whatever its kind (lesson, exercise, reference):
// - the whole query, then each of its words: in the title (5), in headings (4 each, up to 3), and how often in the
//   text (8 per doubling); the whole query counts twice;
// - pages within 80 % of the best score are near ties: the course's path orders them (the lesson that first
//   teaches a concept before the lessons and exercises that build on it), then the reference pages.
var Scorer = {
  rank: (page, words) => {
    const count = (haystack, text) => {  // occurrences of `text` at the start of a word
      let n = 0;
      for (let i = haystack.indexOf(text); i !== -1; i = haystack.indexOf(text, i + text.length)) {
        if (i === 0 || haystack[i - 1] === " " || haystack[i - 1] === "\n") n += 1;
      }
      return n;
    };
    const headings = page.h.split("\n");
    const field = (text) => 5 * (count(page.t, text) > 0)
      + 4 * Math.min(3, headings.filter((h) => count(h, text) > 0).length)
      + 8 * Math.log2(1 + count(page.b, text));
    let rank = words.length > 1 ? 2 * field(words.join(" ")) : 0;
    for (const w of words) rank += field(w);
    return rank;
  },

  ranks: (query) => {
    if (Scorer._query !== query) {
      const words = query.toLowerCase().split(/[^a-z0-9]+/).filter((w) => w.length > 1);
      const ranks = {};
      for (const [docname, page] of Object.entries(Scorer.pages || {})) ranks[docname] = Scorer.rank(page, words);
      Scorer._query = query;
      Scorer._ranks = ranks;
      Scorer._best = Math.max(0, ...Object.values(ranks));
    }
    return Scorer._ranks;
  },

  score: (result) => {
    const [docname, title, anchor, descr, score, filename, kind] = result;
    const query = new URLSearchParams(window.location.search).get("q") || "";
    const rank = Scorer.ranks(query)[docname];
    if (rank === undefined || Scorer._best <= 0) return score;
    if (rank >= 0.8 * Scorer._best) {
      const at = (Scorer.order || []).indexOf(docname);
      return 1e7 - 1e4 * (at === -1 ? 900 : at) + Math.round(rank) + score;
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

// Snippets from the page's prose: Sphinx takes the text of [role=main], which in the book theme holds the theme's
// buttons ("Light Dark"), the page's contents and the launch bar; take the article only, without its code cells and
// outputs (Sphinx loads this file after searchtools.js, as part of language_data.js).
if (typeof Search !== "undefined") {
  Search.htmlToText = (htmlString, anchor) => {
    const doc = new DOMParser().parseFromString(htmlString, "text/html");
    const article = doc.querySelector("article.bd-article") || doc.querySelector('[role="main"]');
    if (!article) return "";
    const drop = [".headerlink", "script", "style", ".swkv-launch", "div.cell_input", "div.cell_output",
                  "div.highlight", ".copybtn", "mjx-container"];
    for (const selector of drop) article.querySelectorAll(selector).forEach((el) => el.remove());
    const part = (anchor && article.querySelector(anchor)) || article;
    return part.textContent.replace(/\s+/g, " ").trim();
  };
}
