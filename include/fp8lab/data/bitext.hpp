// Bitext (parallel text): an English-Spanish translation corpus prepared from Debian's SWORD Bible
// modules (sword-text-kjv: King James Version; sword-text-sparv: Reina-Valera 1909), both
// tagged with Strong's numbers, and a generic reader of line-aligned parallel files.
//
// Preparation: export each module with `mod2imp` (libsword-utils), strip the OSIS markup
// (Strong's <w> wrappers keep their words, notes become a space, canonical titles such as
// psalm superscriptions are kept, other titles dropped), align by verse reference, then
// drop what is not a translation pair:
//   - empty verses (18 Spanish verses are empty, their text being in a neighbour);
//   - verses whose Strong's numbers disagree (fewer than half of the smaller set shared);
//   - shifted chapters: the Spanish module follows the Hebrew verse numbering in about a
//     dozen chapters (Numbers 13, Job 39-40, Jonah 2, ...) although it claims KJV
//     versification. A verse is evidence of a shift when its numbers disagree or agree
//     clearly better (by 0.1) with the English verse before or after; from the first
//     evidence on, a chapter whose remaining verses are at least half evidence (and at
//     least 3) is dropped.
// The split into train/dev/test is by a hash of the verse reference: deterministic and
// independent of the other verses.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fp8lab::data {

struct ImpEntry {
  std::string book;
  int chapter = 0, verse = 0;
  std::string raw;  // OSIS markup
  std::string ref() const { return book + " " + std::to_string(chapter) + ":" + std::to_string(verse); }
};

// Parses mod2imp output ("$$$Book C:V" lines, each followed by its text). Module and
// testament headings and chapter/book introductions (chapter or verse 0) are skipped.
// Errors name `source` and the line.
std::vector<ImpEntry> parse_imp(std::string_view text, const std::string& source);

// Plain text of an OSIS verse (see above); whitespace collapsed, trimmed.
std::string strip_osis(std::string_view raw);
// The Strong's numbers of a verse, normalised ("H0430" -> "H430"), sorted, unique.
std::vector<std::string> strongs_numbers(std::string_view raw);
// |a ∩ b| / min(|a|, |b|); -1 when either is empty.
double strongs_agreement(const std::vector<std::string>& a, const std::vector<std::string>& b);

struct VersePair {
  std::string ref, en, es;
};

struct AlignReport {
  std::size_t verses = 0;           // references in both modules
  std::size_t empty = 0;            // dropped: empty on either side
  std::size_t disagreeing = 0;      // dropped: Strong's numbers disagree (outside shifted chapters)
  std::size_t shifted = 0;          // dropped: in a shifted chapter
  std::vector<std::string> shifted_chapters;  // "Numbers 13 (from 1)"
  std::size_t pairs = 0;
};

// Aligns two modules' entries by reference and filters as described above.
std::vector<VersePair> align_verses(const std::vector<ImpEntry>& en, const std::vector<ImpEntry>& es,
                                    AlignReport* report = nullptr);

// "train", "dev" or "test" for a reference: by hash, `dev_percent` and `test_percent` each.
std::string split_of(const std::string& ref, int dev_percent = 2, int test_percent = 2);

struct CorpusFiles {
  std::string dir;  // holds {train,dev,test}.{en,es,ref} and report.json
  AlignReport report;
};

// Prepares the corpus into `dir` (exporting with mod2imp), or reuses it when `dir` already
// holds a complete corpus of this version. Files are written atomically. Throws Error
// naming what is missing (mod2imp, a module) with the Debian package to install.
CorpusFiles prepare_bible_corpus(const std::string& dir, const std::string& en_module = "engKJV2006eb",
                                 const std::string& es_module = "spaRV1909eb");

// The lines of one side of a parallel text (LF or CRLF; a last line without a newline
// counts); throws Error "<path>:<line>: ..." at an empty line or one that is not UTF-8.
std::vector<std::string> parse_lines(std::string_view text, const std::string& path);

// Reads line-aligned parallel files (`prefix`.`src` and `prefix`.`tgt`); checks that the
// line counts agree (naming both files) and that no line is empty or invalid UTF-8.
std::pair<std::vector<std::string>, std::vector<std::string>> read_bitext(const std::string& prefix,
                                                                            const std::string& src,
                                                                            const std::string& tgt);

}  // namespace fp8lab::data
