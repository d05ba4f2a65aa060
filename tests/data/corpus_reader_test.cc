// CorpusReader: JSONL and text documents, folders in name order, gzip, long documents cut
// where the tokenizer allows, and the errors that name the file and line.
#include "data/corpus_reader.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>

#include "data_test_util.h"

namespace tessera {
namespace {

using testing_util::kRepo;
using testing_util::read_bytes;
using testing_util::repo_tokenizer;
using testing_util::ScratchDir;
using testing_util::write_bytes;

struct Read {
  std::vector<TextPiece> pieces;
  Status status;
  std::vector<CorpusSource> sources;
};

Read read_all(const std::vector<std::string>& inputs, CorpusOptions o = {}) {
  Read r;
  auto reader = CorpusReader::open(inputs, o, repo_tokenizer());
  if (!reader.ok()) {
    r.status = reader.status();
    return r;
  }
  TextPiece piece;
  while (true) {
    auto more = reader->next(&piece);
    if (!more.ok()) {
      r.status = more.status();
      break;
    }
    if (!*more) break;
    r.pieces.push_back(piece);
  }
  r.sources = reader->sources();
  return r;
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), int(bytes.size()));
  gzclose(f);
}

TEST(CorpusReader, JsonlDocumentsAreTheFieldAsIs) {
  ScratchDir dir;
  write_bytes(dir.file("a.jsonl"),
              "{\"text\": \"\\nfirst doc\\n\", \"id\": 1}\n\n  \r\n{\"id\": 2, \"text\": \"\"}\n"
              "{\"text\": \"caf\\u00e9 \\ud83d\\ude00\", \"body\": \"x\"}");  // no final newline
  Read r = read_all({dir.file("a.jsonl")});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_EQ(r.pieces.size(), 2u);
  EXPECT_EQ(r.pieces[0].text, "\nfirst doc\n");  // JSONL text is not trimmed
  EXPECT_EQ(r.pieces[1].text, "caf\u00e9 \U0001F600");
  EXPECT_TRUE(r.pieces[0].starts_document && r.pieces[1].starts_document);
  EXPECT_EQ(r.sources.at(0).documents, 2);
  // Another field.
  CorpusOptions body;
  body.field = "body";
  write_bytes(dir.file("b.jsonl"), "{\"body\": \"x\"}\n");
  r = read_all({dir.file("b.jsonl")}, body);
  ASSERT_EQ(r.pieces.size(), 1u);
  EXPECT_EQ(r.pieces[0].text, "x");
}

TEST(CorpusReader, BadJsonlLinesAreNamedByFileAndLine) {
  ScratchDir dir;
  write_bytes(dir.file("a.jsonl"), "{\"text\": \"ok\"}\n{\"content\": \"x\", \"id\": 3}\n");
  Read r = read_all({dir.file("a.jsonl")});
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find(dir.file("a.jsonl") + "' line 2"), std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.message().find("no string field \"text\" (its fields: content, id)"),
            std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.hint().find("--field"), std::string::npos);
  write_bytes(dir.file("b.jsonl"), "{\"text\": \"ok\"}\n\n{\"text\": \"unterminated}\n");
  r = read_all({dir.file("b.jsonl")});
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("line 3 is not JSON"), std::string::npos) << r.status.message();
  write_bytes(dir.file("c.jsonl"), "{\"text\": 5}\n");
  r = read_all({dir.file("c.jsonl")});
  EXPECT_FALSE(r.status.ok());
  write_bytes(dir.file("d.jsonl"), "{\"text\": \"a\", \"x\": 1e400}\n");  // out of range
  r = read_all({dir.file("d.jsonl")});
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("line 1 is not JSON"), std::string::npos);
}

TEST(CorpusReader, FoldersAreReadRecursivelyInNameOrderPlainOrGzip) {
  ScratchDir dir;
  std::filesystem::create_directories(dir.file("c/sub"));
  write_bytes(dir.file("c/b.txt"), "bee");
  const std::string a = "{\"text\": \"ay\"}\n{\"text\": \"ay2\"}\n";
  write_gz(dir.file("c/a.jsonl.gz"), a);
  write_bytes(dir.file("c/sub/c.md"), "sea<|endoftext|>sea2");
  write_bytes(dir.file("c/notes.csv"), "skipped");
  write_gz(dir.file("c/z.txt.gz"), "zed");
  Read r = read_all({dir.file("c")});
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  std::vector<std::string> texts;
  for (const TextPiece& p : r.pieces) texts.push_back(p.text);
  EXPECT_EQ(texts, (std::vector<std::string>{"ay", "ay2", "bee", "sea", "sea2", "zed"}));
  ASSERT_EQ(r.sources.size(), 4u);
  EXPECT_EQ(r.sources[0].bytes, static_cast<int64_t>(a.size()));  // uncompressed
  // Empty folders and missing inputs are named.
  std::filesystem::create_directories(dir.file("empty"));
  r = read_all({dir.file("empty")});
  EXPECT_NE(r.status.message().find("holds no .txt"), std::string::npos) << r.status.message();
  r = read_all({dir.file("missing.txt")});
  EXPECT_NE(r.status.message().find("does not exist"), std::string::npos) << r.status.message();
}

TEST(CorpusReader, LongTextDocumentsAreCutWhereTheTokenizerAllows) {
  ScratchDir dir;
  const std::string corpus = read_bytes(kRepo + "/data/corpus/moby_dick.txt").substr(0, 300000);
  std::string body = corpus;
  while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
  write_bytes(dir.file("book.txt"), "\n\n" + corpus + "<|endoftext|>second");
  CorpusOptions o;
  o.piece_bytes = 20000;
  Read r = read_all({dir.file("book.txt")}, o);
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  ASSERT_GT(r.pieces.size(), 10u);
  std::string joined;
  size_t starts = 0;
  std::vector<int32_t> ids;
  for (const TextPiece& p : r.pieces) {
    if (p.starts_document) {
      ++starts;
      if (starts == 2) break;
    } else {
      EXPECT_EQ(p.text.front(), '\n');  // a cut before a line break
    }
    joined += p.text;
    repo_tokenizer().encode_append(p.text, &ids, p.starts_document);
  }
  EXPECT_EQ(starts, 2u);
  EXPECT_EQ(joined, body.substr(body.find_first_not_of('\n')));
  EXPECT_EQ(ids, repo_tokenizer().encode(joined));
  EXPECT_EQ(r.pieces.back().text, "second");
}

TEST(CorpusReader, TextThatIsNotUtf8IsNamedByOffsetAndLine) {
  ScratchDir dir;
  write_bytes(dir.file("a.txt"), "ok\nstill ok\nbad \xff here");
  Read r = read_all({dir.file("a.txt")});
  ASSERT_FALSE(r.status.ok());
  EXPECT_NE(r.status.message().find("byte 0xFF at offset 16 (line 3)"), std::string::npos)
      << r.status.message();
}

}  // namespace
}  // namespace tessera
