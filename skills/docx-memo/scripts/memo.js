#!/usr/bin/env node
// Build a Word memo (.docx) from a JSON description: node scripts/memo.js MEMO.json OUT.docx
// MEMO.json: {"title": "...", "from": "...", "to": "...", "paragraphs": ["..."], "table": [["head", ...], [...]]}
"use strict";
const fs = require("fs");
const path = require("path");
const docx = require("docx");

function usage(message) {
  process.stderr.write(`memo.js: ${message}\nusage: node scripts/memo.js MEMO.json OUT.docx\n`);
  process.exit(2);
}

function cell(text, bold) {
  return new docx.TableCell({ children: [new docx.Paragraph({ children: [new docx.TextRun({ text: String(text), bold })] })] });
}

function build(memo) {
  const children = [new docx.Paragraph({ text: memo.title, heading: docx.HeadingLevel.HEADING_1 })];
  for (const [label, value] of [["From", memo.from], ["To", memo.to]]) {
    if (value) {
      children.push(new docx.Paragraph({ children: [new docx.TextRun({ text: `${label}: `, bold: true }), new docx.TextRun(String(value))] }));
    }
  }
  for (const text of memo.paragraphs || []) {
    children.push(new docx.Paragraph({ text: String(text), spacing: { after: 120 } }));
  }
  if (Array.isArray(memo.table) && memo.table.length) {
    const rows = memo.table.map((row, index) => new docx.TableRow({ children: row.map((value) => cell(value, index === 0)) }));
    children.push(new docx.Table({ rows, width: { size: 100, type: docx.WidthType.PERCENTAGE } }));
  }
  return new docx.Document({ creator: memo.from || "skillrun", title: memo.title, sections: [{ children }] });
}

async function main() {
  const [input, output] = process.argv.slice(2);
  if (!input || !output) usage("two arguments are needed");
  let memo;
  try {
    memo = JSON.parse(fs.readFileSync(input, "utf8"));
  } catch (error) {
    usage(`cannot read ${input}: ${error.message}`);
  }
  if (typeof memo.title !== "string" || !memo.title) usage(`${input} needs a "title"`);
  const buffer = await docx.Packer.toBuffer(build(memo));
  fs.mkdirSync(path.dirname(path.resolve(output)), { recursive: true });
  fs.writeFileSync(output, buffer);
  console.log(`wrote ${output} (${buffer.length} bytes, ${(memo.paragraphs || []).length} paragraphs)`);
}

main().catch((error) => { process.stderr.write(`memo.js: ${error.stack || error}\n`); process.exit(1); });
