// A small Markdown renderer that builds DOM nodes and sets every piece of
// text with textContent: model output is never parsed as HTML, and a link
// is made only for http(s) and mailto addresses.
//
// Blocks: fenced code (with highlighting and a copy button), headings,
// rules, block quotes, lists (nested by indentation), pipe tables and
// paragraphs (a single newline is a line break). Inline: code spans,
// **strong**, *emphasis*, ~~strike~~, [links](https://...), bare
// https:// addresses and backslash escapes. An unclosed fence, as in a
// reply still streaming, renders as code so far.

import { highlight } from "./highlight.js";

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$/;
const RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])[ \t]+(.*)$/;
const TABLE_SEP = /^ {0,3}\|?[ \t]*:?-{1,}:?[ \t]*(\|[ \t]*:?-{1,}:?[ \t]*)*\|?[ \t]*$/;

function el(tag, className) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  return e;
}

function blank(line) {
  return /^\s*$/.test(line);
}

function isTableStart(lines, i) {
  return lines[i].includes("|") && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-");
}

function startsBlock(lines, i) {
  const line = lines[i];
  return FENCE.test(line) || HEADING.test(line) || RULE.test(line) || QUOTE.test(line) || ITEM.test(line) || isTableStart(lines, i);
}

function cells(row) {
  let s = row.trim();
  if (s.startsWith("|")) s = s.slice(1);
  if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
  const out = [];
  let cur = "";
  for (let i = 0; i < s.length; i++) {
    if (s[i] === "\\" && s[i + 1] === "|") {
      cur += "|";
      i++;
    } else if (s[i] === "|") {
      out.push(cur.trim());
      cur = "";
    } else {
      cur += s[i];
    }
  }
  out.push(cur.trim());
  return out;
}

// A code block with its language, a copy button and highlighting.
export function codeBlock(code, lang) {
  const box = el("div", "code");
  const bar = el("div", "bar");
  const name = el("span");
  name.textContent = lang || "text";
  const copy = el("button", "small copy");
  copy.type = "button";
  copy.textContent = "Copy";
  copy.setAttribute("aria-label", "Copy code");
  copy.addEventListener("click", () => copyText(code, copy));
  bar.append(name, copy);
  const pre = el("pre");
  const c = el("code");
  highlight(c, code, lang);
  pre.appendChild(c);
  box.append(bar, pre);
  return box;
}

async function copyText(text, button) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch {
    // Without a secure context there is no clipboard API: the old way.
    const area = document.createElement("textarea");
    area.value = text;
    area.setAttribute("readonly", "");
    area.style.position = "fixed";
    area.style.opacity = "0";
    document.body.appendChild(area);
    area.select();
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    area.remove();
  }
  button.textContent = ok ? "Copied" : "Copy failed";
  setTimeout(() => (button.textContent = "Copy"), 1500);
}

function parseBlocks(lines, parent) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (blank(line)) {
      i++;
      continue;
    }
    let m = FENCE.exec(line);
    if (m) {
      const fence = m[1];
      const body = [];
      i++;
      const close = new RegExp("^ {0,3}" + (fence[0] === "`" ? "`" : "~") + "{" + fence.length + ",}[ \\t]*$");
      while (i < lines.length && !close.test(lines[i])) body.push(lines[i++]);
      i++; // the closing fence (or the end of the text)
      parent.appendChild(codeBlock(body.join("\n"), m[2]));
      continue;
    }
    m = HEADING.exec(line);
    if (m) {
      const h = el("h" + m[1].length);
      inline(m[2], h);
      parent.appendChild(h);
      i++;
      continue;
    }
    if (RULE.test(line)) {
      parent.appendChild(el("hr"));
      i++;
      continue;
    }
    if (QUOTE.test(line)) {
      const inner = [];
      let q;
      while (i < lines.length && (q = QUOTE.exec(lines[i]))) {
        inner.push(q[1]);
        i++;
      }
      const bq = el("blockquote");
      parseBlocks(inner, bq);
      parent.appendChild(bq);
      continue;
    }
    if (ITEM.test(line)) {
      i = parseList(lines, i, parent);
      continue;
    }
    if (isTableStart(lines, i)) {
      i = parseTable(lines, i, parent);
      continue;
    }
    const para = [];
    while (i < lines.length && !blank(lines[i]) && (para.length === 0 || !startsBlock(lines, i))) {
      para.push(lines[i].trim());
      i++;
    }
    const p = el("p");
    inline(para.join("\n"), p);
    parent.appendChild(p);
  }
}

function parseList(lines, i, parent) {
  const first = ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = el(ordered ? "ol" : "ul");
  if (ordered) {
    const start = parseInt(first[2], 10);
    if (start !== 1) list.start = start;
  }
  let loose = false;
  const items = [];
  while (i < lines.length) {
    const m = ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const content = [m[3]];
    const inner = indent + m[2].length + 1;
    i++;
    while (i < lines.length) {
      const line = lines[i];
      if (blank(line)) {
        // A blank line inside an item only when the item goes on after it.
        const next = lines[i + 1];
        if (next !== undefined && !blank(next) && next.search(/\S/) >= inner) {
          content.push("");
          loose = true;
          i++;
          continue;
        }
        break;
      }
      const lead = line.search(/\S/);
      const sub = ITEM.exec(line);
      if (sub && sub[1].length <= indent) break;
      if (lead < inner && !sub && startsBlock(lines, i)) break;
      content.push(lead >= inner ? line.slice(inner) : line.trimStart());
      i++;
    }
    items.push(content);
    if (i < lines.length && blank(lines[i])) {
      const next = lines[i + 1];
      const again = next !== undefined ? ITEM.exec(next) : null;
      if (again && again[1].length === indent) {
        loose = true;
        i++;
      }
    }
  }
  for (const content of items) {
    const li = el("li");
    const box = document.createDocumentFragment();
    parseBlocks(content, box);
    // A tight item holds its text, not a paragraph.
    if (!loose && box.firstChild && box.firstChild.tagName === "P") {
      const p = box.firstChild;
      while (p.firstChild) li.appendChild(p.firstChild);
      p.remove();
    }
    li.appendChild(box);
    list.appendChild(li);
  }
  parent.appendChild(list);
  return i;
}

function parseTable(lines, i, parent) {
  const head = cells(lines[i]);
  const aligns = cells(lines[i + 1]).map((c) =>
    c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : c.startsWith(":") ? "left" : "",
  );
  i += 2;
  const table = el("table");
  const thead = el("thead");
  const tr = el("tr");
  head.forEach((c, k) => {
    const th = el("th");
    if (aligns[k]) th.style.textAlign = aligns[k];
    inline(c, th);
    tr.appendChild(th);
  });
  thead.appendChild(tr);
  table.appendChild(thead);
  const tbody = el("tbody");
  while (i < lines.length && !blank(lines[i]) && lines[i].includes("|")) {
    const row = el("tr");
    const cs = cells(lines[i]);
    head.forEach((_, k) => {
      const td = el("td");
      if (aligns[k]) td.style.textAlign = aligns[k];
      inline(cs[k] || "", td);
      row.appendChild(td);
    });
    tbody.appendChild(row);
    i++;
  }
  table.appendChild(tbody);
  parent.appendChild(table);
  return i;
}

function safeUrl(url) {
  try {
    const u = new URL(url, window.location.href);
    return ["http:", "https:", "mailto:"].includes(u.protocol) ? u.href : null;
  } catch {
    return null;
  }
}

function link(text, url, parent) {
  const href = safeUrl(url);
  if (!href) {
    parent.appendChild(document.createTextNode(text));
    return;
  }
  const a = el("a");
  a.href = href;
  a.target = "_blank";
  a.rel = "noopener noreferrer";
  inline(text, a);
  parent.appendChild(a);
}

const ESCAPABLE = "\\`*_{}[]()#+-.!~|>";

// Renders inline Markdown of `text` into `parent`.
export function inline(text, parent) {
  let plain = "";
  const flush = () => {
    if (plain) parent.appendChild(document.createTextNode(plain));
    plain = "";
  };
  let i = 0;
  while (i < text.length) {
    const ch = text[i];
    if (ch === "\\" && i + 1 < text.length && ESCAPABLE.includes(text[i + 1])) {
      plain += text[i + 1];
      i += 2;
      continue;
    }
    if (ch === "\n") {
      flush();
      parent.appendChild(el("br"));
      i++;
      continue;
    }
    if (ch === "`") {
      let n = 0;
      while (text[i + n] === "`") n++;
      const ticks = "`".repeat(n);
      const end = text.indexOf(ticks, i + n);
      if (end > 0) {
        flush();
        const c = el("code");
        let body = text.slice(i + n, end);
        if (/^ .* $/.test(body)) body = body.slice(1, -1);
        c.textContent = body;
        parent.appendChild(c);
        i = end + n;
        continue;
      }
      plain += ticks;
      i += n;
      continue;
    }
    if (ch === "[") {
      const m = /^\[([^\]\n]*)\]\(<?([^\s()<>]+)>?(?:\s+"[^"]*")?\)/.exec(text.slice(i));
      if (m) {
        flush();
        link(m[1], m[2], parent);
        i += m[0].length;
        continue;
      }
    }
    if (ch === "h" && (i === 0 || /[\s(]/.test(text[i - 1]))) {
      const m = /^https?:\/\/[^\s<>()]+/.exec(text.slice(i));
      if (m) {
        const url = m[0].replace(/[.,;:!?'"]+$/, "");
        flush();
        link(url, url, parent);
        i += url.length;
        continue;
      }
    }
    const pair = ["**", "__", "~~"].find((d) => text.startsWith(d, i));
    if (pair) {
      const end = text.indexOf(pair, i + 2);
      if (end > i + 2 && !/\s/.test(text[i + 2]) && !/\s/.test(text[end - 1])) {
        flush();
        const e = el(pair === "~~" ? "del" : "strong");
        inline(text.slice(i + 2, end), e);
        parent.appendChild(e);
        i = end + 2;
        continue;
      }
    }
    if ((ch === "*" || ch === "_") && !/\s/.test(text[i + 1] || " ")) {
      // An underscore inside a word (snake_case) is not emphasis.
      const wordBefore = i > 0 && /\w/.test(text[i - 1]);
      if (!(ch === "_" && wordBefore)) {
        let end = i + 1;
        while ((end = text.indexOf(ch, end)) > 0) {
          if (text[end + 1] === ch) {
            end += 2;
            continue;
          }
          const after = text[end + 1] || " ";
          if (!/\s/.test(text[end - 1]) && !(ch === "_" && /\w/.test(after))) break;
          end++;
        }
        if (end > i + 1) {
          flush();
          const e = el("em");
          inline(text.slice(i + 1, end), e);
          parent.appendChild(e);
          i = end + 1;
          continue;
        }
      }
    }
    plain += ch;
    i++;
  }
  flush();
}

// The Markdown `text` as a fragment of DOM nodes.
export function render(text) {
  const frag = document.createDocumentFragment();
  parseBlocks(text.replace(/\r\n?/g, "\n").split("\n"), frag);
  return frag;
}
