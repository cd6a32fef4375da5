// A small syntax highlighter: it cuts code into comments, strings,
// numbers, keywords and literals by a few rules per language and returns
// DOM nodes whose text is set with textContent, so code from the model is
// never parsed as HTML.

const C_LIKE = {
  comments: [["//", "\n"], ["/*", "*/"]],
  strings: ['"', "'", "`"],
  keywords: "break case catch class const continue default delete do else enum export extends finally for function if import in instanceof interface let new return static super switch this throw try typeof var void while with yield async await public private protected struct impl fn mut pub use mod match trait where type namespace template typename virtual override sizeof go func package defer chan select range map",
  literals: "true false null undefined nil NULL None self Self nullptr",
};

const LANGS = {
  python: {
    comments: [["#", "\n"]],
    strings: ['"""', "'''", '"', "'"],
    keywords: "and as assert async await break class continue def del elif else except finally for from global if import in is lambda nonlocal not or pass raise return try while with yield match case print",
    literals: "True False None self cls",
  },
  shell: {
    comments: [["#", "\n"]],
    strings: ['"', "'"],
    keywords: "if then else elif fi for while do done case esac in function return export local echo cd set unset source exit",
    literals: "true false",
  },
  json: { comments: [], strings: ['"'], keywords: "", literals: "true false null" },
  sql: {
    comments: [["--", "\n"], ["/*", "*/"]],
    strings: ["'", '"'],
    keywords: "select from where insert into values update set delete create table drop alter and or not null is in as join left right inner outer on group by order having limit offset union distinct primary key references index",
    literals: "true false null",
  },
  c: C_LIKE,
};

const ALIASES = {
  py: "python", python3: "python", sh: "shell", bash: "shell", zsh: "shell", console: "shell",
  js: "c", javascript: "c", ts: "c", typescript: "c", jsx: "c", tsx: "c", java: "c",
  cpp: "c", "c++": "c", cc: "c", h: "c", rust: "c", rs: "c", go: "c", golang: "c",
  csharp: "c", cs: "c", kotlin: "c", swift: "c", php: "c", scala: "c", dart: "c",
  jsonc: "json", postgresql: "sql", mysql: "sql", sqlite: "sql",
};

function rules(lang) {
  const name = (lang || "").toLowerCase();
  return LANGS[name] || LANGS[ALIASES[name]] || null;
}

const WORD = /[A-Za-z_$][\w$]*/y;
const NUMBER = /(?:0[xX][\da-fA-F_]+|\d[\d_]*(?:\.\d[\d_]*)?(?:[eE][+-]?\d+)?)\b/y;

function span(kind, text) {
  const s = document.createElement("span");
  s.className = "tok-" + kind;
  s.textContent = text;
  return s;
}

// Appends the highlighted `code` to `parent` (plain text for a language it
// does not know).
export function highlight(parent, code, lang) {
  const r = rules(lang);
  if (!r) {
    parent.textContent = code;
    return;
  }
  const keywords = new Set(r.keywords.split(" ").filter(Boolean));
  const literals = new Set(r.literals.split(" ").filter(Boolean));
  const lower = r === LANGS.sql;
  let plain = "";
  const flush = () => {
    if (plain) parent.appendChild(document.createTextNode(plain));
    plain = "";
  };
  let i = 0;
  outer: while (i < code.length) {
    for (const [open, close] of r.comments) {
      if (code.startsWith(open, i)) {
        let end = code.indexOf(close, i + open.length);
        end = end < 0 ? code.length : close === "\n" ? end : end + close.length;
        flush();
        parent.appendChild(span("comment", code.slice(i, end)));
        i = end;
        continue outer;
      }
    }
    for (const q of r.strings) {
      if (code.startsWith(q, i)) {
        let j = i + q.length;
        while (j < code.length && !code.startsWith(q, j)) {
          if (code[j] === "\\") j++;
          else if (code[j] === "\n" && q.length === 1 && q !== "`") break;
          j++;
        }
        const end = Math.min(code.length, code.startsWith(q, j) ? j + q.length : j);
        flush();
        parent.appendChild(span("string", code.slice(i, end)));
        i = end;
        continue outer;
      }
    }
    const prev = i > 0 ? code[i - 1] : "";
    if (!/[\w$]/.test(prev)) {
      NUMBER.lastIndex = i;
      const n = NUMBER.exec(code);
      if (n) {
        flush();
        parent.appendChild(span("number", n[0]));
        i += n[0].length;
        continue;
      }
      WORD.lastIndex = i;
      const w = WORD.exec(code);
      if (w) {
        const word = lower ? w[0].toLowerCase() : w[0];
        if (keywords.has(word)) {
          flush();
          parent.appendChild(span("keyword", w[0]));
        } else if (literals.has(word)) {
          flush();
          parent.appendChild(span("literal", w[0]));
        } else {
          plain += w[0];
        }
        i += w[0].length;
        continue;
      }
    }
    plain += code[i];
    i++;
  }
  flush();
}
