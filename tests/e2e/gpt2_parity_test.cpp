// Tokenizer parity at scale: `trident prepare --tokenizer gpt2` against the npm package
// gpt-3-encoder's own JavaScript encoder (tests/reference/gpt2_reference_encode.js), on
// about 3 MB of generated text.
//
// The text is made deterministically (std::mt19937, whose sequence the standard fixes)
// from section generators: English prose from built-in paragraphs with variations (case,
// word swaps, punctuation, line wrapping), C++ and Python code, numbers and dates, long
// runs of spaces, tabs and newlines (and the Unicode spaces), contractions ('s 't 're 've
// 'm 'll 'd, their uppercase forms and the curly apostrophe), accented Latin, Greek,
// Cyrillic, Arabic, Hebrew, Devanagari, Thai, Chinese, Japanese and Korean, emoji (ZWJ
// sequences, skin tones, flags, keycaps, variation selectors), combining marks, and a
// little ill-formed UTF-8 (both sides replace it with U+FFFD by the WHATWG rule). It is
// split into documents of 30-60 KB, one file each: the npm encoder is slow (about
// 0.13 MB/s, and worse than linear in a document's length), so small documents keep
// the node run near 20 s.
//
// The token stream prepare writes (llm.c shards, several of them, read back in order)
// must equal, exactly, the concatenation over the files of [50256] + npm_ids(file).
//
// Left out on purpose: U+0085 and U+FEFF. Trident follows OpenAI's encoder.py and
// tiktoken, whose \s holds U+0085 and not U+FEFF; JavaScript's \s, which the npm
// encoder's regex uses, is the reverse. tests/data/gpt2_tokenizer_test.cpp
// (WhitespaceIsUnicodeWhiteSpaceLikeTiktoken) pins tiktoken's ids for those two.
//
// node (preinstalled on every machine of the project and in CI) and the GPT-2 files
// (scripts/fetch_gpt2_vocab.sh) are required: without them this test FAILS, it never
// skips.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "data/gpt2_tokenizer.h"
#include "data/token_file.h"
#include "tests/common/gpt2_files.h"
#include "tests/e2e/cli_util.h"

namespace trident {
namespace {

using testing::run_command;

// ---- the text generator ------------------------------------------------------------

class TextGen {
 public:
  explicit TextGen(uint32_t seed) : rng_(seed) {}

  // One document of at least `bytes` bytes, made of random sections.
  std::string document(size_t bytes) {
    std::string doc;
    while (doc.size() < bytes) {
      switch (below(10)) {
        case 0: case 1: prose(&doc); break;
        case 2: code(&doc); break;
        case 3: numbers(&doc); break;
        case 4: whitespace(&doc); break;
        case 5: contractions(&doc); break;
        case 6: case 7: scripts(&doc); break;
        case 8: emoji(&doc); break;
        default: combining(&doc); break;
      }
    }
    return doc;
  }

 private:
  uint32_t next() { return static_cast<uint32_t>(rng_()); }
  uint32_t below(uint32_t n) { return next() % n; }
  bool chance(uint32_t percent) { return below(100) < percent; }
  template <size_t N>
  const char* pick(const char* const (&items)[N]) { return items[below(N)]; }

  static std::vector<std::string> words(const std::string& text) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string w;
    while (in >> w) out.push_back(w);
    return out;
  }

  static void upper_ascii(std::string* w) {
    for (char& c : *w) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    }
  }

  // A built-in paragraph re-flowed with variations.
  void prose(std::string* out) {
    static const char* const kParagraphs[] = {
        "It is a truth universally acknowledged, that a single man in possession of a good "
        "fortune, must be in want of a wife. However little known the feelings or views of "
        "such a man may be on his first entering a neighbourhood, this truth is so well "
        "fixed in the minds of the surrounding families.",
        "Call me Ishmael. Some years ago - never mind how long precisely - having little or "
        "no money in my purse, and nothing particular to interest me on shore, I thought I "
        "would sail about a little and see the watery part of the world.",
        "The quick brown fox jumps over the lazy dog; meanwhile, the committee (which had "
        "met on Tuesday) concluded that the proposal was \"premature\" and asked for a "
        "revised estimate by the end of Q3.",
        "In the beginning the Universe was created. This has made a lot of people very angry "
        "and been widely regarded as a bad move. Many were increasingly of the opinion that "
        "they'd all made a big mistake in coming down from the trees in the first place.",
        "Researchers at the institute reported a 12.5% improvement in throughput after "
        "replacing the scheduler; the new version, v2.3.1, ships next month. Critics, "
        "however, noted that the benchmark ran on a single node with 8 GPUs.",
        "She opened the door, hesitated, and stepped into the rain. Somewhere a dog barked. "
        "\"Are you coming?\" he called after her. She didn't answer; she'd already made up "
        "her mind, and nothing he'd say would change it now.",
        "Transformers process sequences of tokens with self-attention: every position attends "
        "to every earlier one, weighted by the softmax of scaled dot products. Layer norm, "
        "residual connections and a feed-forward block complete each layer.",
        "Whereas recognition of the inherent dignity and of the equal and inalienable rights "
        "of all members of the human family is the foundation of freedom, justice and peace "
        "in the world...",
    };
    static const char* const kSwaps[] = {"however", "THE", "Nevertheless", "data", "model",
                                         "e.g.", "i.e.", "etc.", "U.S.A.", "Mr.", "Dr.",
                                         "well-known", "state-of-the-art", "re-entry"};
    std::vector<std::string> ws = words(pick(kParagraphs));
    const size_t width = 40 + below(80);
    size_t column = 0;
    for (std::string& w : ws) {
      if (chance(5)) w = pick(kSwaps);
      if (chance(4)) upper_ascii(&w);
      if (chance(3) && !w.empty() && w[0] >= 'a' && w[0] <= 'z') w[0] = char(w[0] - 32);
      if (chance(2)) w += pick({",", ";", "!", "?", "...", ":", "!!", "?!", ")"});
      if (chance(2)) w = "(" + w;
      if (chance(2)) w = "\"" + w + "\"";
      if (column > 0 && column + w.size() > width) {
        *out += chance(80) ? "\n" : " \n";
        column = 0;
      } else if (column > 0) {
        *out += chance(97) ? " " : "  ";
        ++column;
      }
      *out += w;
      column += w.size();
    }
    *out += chance(50) ? "\n\n" : "\n";
  }

  void code(std::string* out) {
    static const char* const kCpp[] = {
        "#include <vector>\n#include <string>\n\nnamespace demo {\n\n",
        "template <typename T>\nT clamp(T v, T lo, T hi) {\n"
        "  return v < lo ? lo : (v > hi ? hi : v);\n}\n",
        "int main(int argc, char** argv) {\n  std::vector<int> xs{1, 2, 3};\n"
        "  for (int i = 0; i < argc; ++i) {\n    std::printf(\"%s\\n\", argv[i]);\n"
        "  }\n  return 0;\n}\n",
        "struct Point { double x = 0.0, y = 0.0; };\n// distance between two points\ninline "
        "double dist(const Point& a, const Point& b) "
        "{ return std::hypot(a.x - b.x, a.y - b.y); }\n",
        "\tif (ptr == nullptr) {\n\t\tthrow std::runtime_error(\"null pointer at \" + "
        "std::to_string(__LINE__));\n\t}\n",
        "auto it = std::find_if(v.begin(), v.end(), "
        "[&](const auto& e) { return e->id == key; });\n",
        "}  // namespace demo\n",
        "/* block comment\n * with stars\n */\nconstexpr uint64_t kMask = 0xFFFF'FFFFull;\n",
    };
    static const char* const kPython[] = {
        "def fib(n: int) -> int:\n    a, b = 0, 1\n    for _ in range(n):\n"
        "        a, b = b, a + b\n    return a\n",
        "class Model(nn.Module):\n    def __init__(self, d_model=768):\n"
        "        super().__init__()\n"
        "        self.proj = nn.Linear(d_model, 4 * d_model)\n",
        "if __name__ == \"__main__\":\n    import sys\n    sys.exit(main(sys.argv[1:]))\n",
        "data = {'a': 1, \"b\": [1, 2, 3], 'c': None}  # a dict\nprint(f\"{data['a']:>10}\")\n",
        "    @property\n    def name(self):\n        return self._name  # noqa: E501\n",
        "xs = [x ** 2 for x in range(10) if x % 3 != 0]\nassert sum(xs) == 0, 'never'\n",
        "with open(path, 'rb') as f:\n\tfor line in f:\n\t\tyield line.rstrip(b'\\r\\n')\n",
    };
    const int n = 1 + static_cast<int>(below(4));
    for (int i = 0; i < n; ++i) *out += chance(50) ? pick(kCpp) : pick(kPython);
    if (chance(30)) *out += "    \n\t\n";
    *out += "\n";
  }

  void numbers(std::string* out) {
    const int n = 10 + static_cast<int>(below(30));
    char buf[96];
    for (int i = 0; i < n; ++i) {
      switch (below(9)) {
        case 0: std::snprintf(buf, sizeof buf, "%u", next() >> below(32)); break;
        case 1: std::snprintf(buf, sizeof buf, "-%u.%02u", below(100000), below(100)); break;
        case 2:
          std::snprintf(buf, sizeof buf, "%04u-%02u-%02u", 1900 + below(200), 1 + below(12),
                        1 + below(28));
          break;
        case 3:
          std::snprintf(buf, sizeof buf, "%02u/%02u/%u %02u:%02u:%02u", 1 + below(28),
                        1 + below(12), 1970 + below(60), below(24), below(60), below(60));
          break;
        case 4: std::snprintf(buf, sizeof buf, "0x%08X", next()); break;
        case 5:
          std::snprintf(buf, sizeof buf, "%u,%03u,%03u.%02u", below(1000), below(1000),
                        below(1000), below(100));
          break;
        case 6: std::snprintf(buf, sizeof buf, "%u.%u.%u", below(20), below(50), below(200)); break;
        case 7: std::snprintf(buf, sizeof buf, "%u%%", below(101)); break;
        default: {
          static const char* const kSuffix[] = {"st", "nd", "rd", "th", "e6", "km", "ms", "GB"};
          std::snprintf(buf, sizeof buf, "%u%s", 1 + below(999), pick(kSuffix));
          break;
        }
      }
      *out += buf;
      *out += pick({" ", ", ", "; ", "\n", "\t", " | ", "  "});
    }
    std::string digits;  // a long digit run
    for (uint32_t i = 0, len = 20 + below(200); i < len; ++i) digits += char('0' + below(10));
    *out += digits + "\n";
  }

  void whitespace(std::string* out) {
    static const char* const kUnicodeSpaces[] = {"\u00a0", "\u1680", "\u2000", "\u2003",
                                                 "\u2009", "\u200a", "\u2028", "\u2029",
                                                 "\u202f", "\u205f", "\u3000", "\x0b", "\x0c"};
    const int n = 3 + static_cast<int>(below(8));
    for (int i = 0; i < n; ++i) {
      switch (below(8)) {
        case 0: *out += std::string(1 + below(400), ' '); break;
        case 1: *out += std::string(1 + below(40), '\t'); break;
        case 2: *out += std::string(1 + below(60), '\n'); break;
        case 3:
          for (uint32_t k = 0, m = 1 + below(30); k < m; ++k) *out += "\r\n";
          break;
        case 4:
          for (uint32_t k = 0, m = 1 + below(40); k < m; ++k) {
            *out += pick({" ", "\t", "\n", " \n", "\n ", "\t\n", "\r"});
          }
          break;
        case 5:
          for (uint32_t k = 0, m = 1 + below(10); k < m; ++k) *out += pick(kUnicodeSpaces);
          break;
        default: break;
      }
      *out += pick({"word", "x", "'s", "42", "\u00e9t\u00e9", "\u4e2d", "!", "\U0001F600",
                    "<|endoftext|>", ""});
    }
  }

  void contractions(std::string* out) {
    static const char* const kWords[] = {
        "It's", "don't", "they're", "we've", "I'm", "you'll", "he'd", "can't", "won't",
        "shouldn't've", "y'all", "o'clock", "rock'n'roll", "IT'S", "DON'T", "THEY'RE",
        "WE'VE", "I'M", "YOU'LL", "HE'D", "It'S", "Don'T", "they'Re", "'s", "'t", "'re",
        "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'VE", "'M", "'LL", "'D", "''", "'",
        "it\u2019s", "don\u2019t", "'tis", "'90s", "rock 'n' roll", "'sup", "ma'am",
        "John's", "JOHN'S", "the cats' toys", "l'\u00e9t\u00e9", "d'Artagnan", "'123"};
    const int n = 10 + static_cast<int>(below(40));
    for (int i = 0; i < n; ++i) {
      *out += pick(kWords);
      *out += pick({" ", " ", " ", ", ", ". ", "\n", "  ", "'", ""});
    }
    *out += "\n";
  }

  void scripts(std::string* out) {
    static const char* const kText[] = {
        "Les \u00e9l\u00e8ves na\u00effs ont d\u00e9j\u00e0 mang\u00e9 cr\u00e8me br\u00fbl\u00e9e "
        "\u00e0 l'h\u00f4tel.",
        "Gr\u00fc\u00dfe aus M\u00fcnchen: \u00c4pfel, \u00d6l und \u00dcbermut, Stra\u00dfe "
        "\u1e9e.",
        "Ma\u00f1ana el ni\u00f1o comer\u00e1 pi\u00f1a en Espa\u00f1a, \u00bfverdad? "
        "\u00a1S\u00ed!",
        "Za\u017c\u00f3\u0142\u0107 g\u0119\u015bl\u0105 ja\u017a\u0144. P\u0159\u00edli\u0161 "
        "\u017elu\u0165ou\u010dk\u00fd k\u016f\u0148.",
        "Ti\u1ebfng Vi\u1ec7t c\u00f3 nhi\u1ec1u d\u1ea5u: \u0111\u01b0\u1eddng ph\u1ed1 "
        "H\u00e0 N\u1ed9i.",
        "S\u00e3o Paulo, cora\u00e7\u00e3o, a\u00e7\u00facar; \u00c5ngstr\u00f6m, "
        "\u00f8l, \u00e6ble.",
        "\u039e\u03b5\u03c3\u03ba\u03b5\u03c0\u03ac\u03b6\u03c9 \u03c4\u1f74\u03bd "
        "\u03c8\u03c5\u03c7\u03bf\u03c6\u03b8\u03cc\u03c1\u03b1 \u03b2\u03b4\u03b5\u03bb"
        "\u03c5\u03b3\u03bc\u03af\u03b1. \u0391\u0392\u0393 \u03b1\u03b2\u03b3.",
        "\u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 "
        "\u043c\u044f\u0433\u043a\u0438\u0445 \u0444\u0440\u0430\u043d\u0446\u0443\u0437"
        "\u0441\u043a\u0438\u0445 \u0431\u0443\u043b\u043e\u043a, \u0434\u0430 \u0432\u044b"
        "\u043f\u0435\u0439 \u0447\u0430\u044e. \u0407\u0436\u0430\u043a \u0490\u0435\u043d.",
        "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65"
        "\u5427\u3002\u4e2d\u6587\u5206\u8bcd\u5f88\u96be\uff01",
        "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3067\u3059\u3002\u30ab\u30bf\u30ab\u30ca\u3068"
        "\u3072\u3089\u304c\u306a\u3001\u6f22\u5b57\u3002\uff34\uff4f\uff4b\uff59\uff4f\u3000"
        "\uff11\uff12\uff13",
        "\ud55c\uad6d\uc5b4 \ubb38\uc7a5\uc785\ub2c8\ub2e4. \uc548\ub155\ud558\uc138\uc694!",
        "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645 "
        "\u0661\u0662\u0663 \u0627\u0644\u0639\u0631\u0628\u064a\u0629.",
        "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd, \u05e2\u05d1\u05e8\u05d9\u05ea.",
        "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e, "
        "\u0939\u093f\u0928\u094d\u0926\u0940 \u092d\u093e\u0937\u093e\u0964 \u0967\u0968\u0969",
        "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a \u0e20\u0e32\u0e29"
        "\u0e32\u0e44\u0e17\u0e22",
        "\u00bd \u00bc \u2153 \u00b2 \u00b3 \u2460 \u2161 \u216b \u221e \u2211 \u222b \u2248 "
        "\u2260 \u00b1 \u00d7 \u00f7 \u20ac \u00a3 \u00a5 \u00a9 \u00ae \u2122 \u00a7 \u00b6",
    };
    const int n = 2 + static_cast<int>(below(8));
    for (int i = 0; i < n; ++i) {
      *out += pick(kText);
      *out += pick({" ", "\n", "", "  ", "\n\n", "123"});
    }
    if (chance(20)) *out += pick({"\xff", "\xc3", "\xe2\x82", "\xed\xa0\x80", "\xf0\x9f\x98",
                                 "\xc0\xaf", "\x80\x80"});  // ill-formed UTF-8
    *out += "\n";
  }

  void emoji(std::string* out) {
    static const char* const kEmoji[] = {
        "\U0001F600", "\U0001F602", "\U0001F914", "\U0001F680", "\u2764\ufe0f", "\u2728",
        "\U0001F44D\U0001F3FD", "\U0001F44B\U0001F3FB", "\U0001F9D1\U0001F3FF",
        "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466",
        "\U0001F469\U0001F3FE\u200d\U0001F4BB", "\U0001F3F3\ufe0f\u200d\U0001F308",
        "\U0001F1EF\U0001F1F5", "\U0001F1E9\U0001F1EA", "\U0001F1FA\U0001F1F8", "1\ufe0f\u20e3",
        "#\ufe0f\u20e3", "\u263a", "\u2639\ufe0f", "\U0001F9D1\u200d\U0001F91D\u200d\U0001F9D1",
        "\U0001F408\u200d\u2B1B", "\U0001FAE0", "\U0001F525\U0001F525\U0001F525"};
    const int n = 5 + static_cast<int>(below(30));
    for (int i = 0; i < n; ++i) {
      *out += pick(kEmoji);
      *out += pick({"", "", " ", "  ", "\n", " ok ", "!", "lol", "\u00e9"});
    }
    *out += "\n";
  }

  void combining(std::string* out) {
    static const char* const kBase[] = {"e", "a", "o", "n", "Z", "i", "\u0430", "\u03b1", " ",
                                        "1", "\u4e00"};
    static const char* const kMarks[] = {"\u0301", "\u0300", "\u0308", "\u0303", "\u0327",
                                         "\u030a", "\u0336", "\u0489", "\u0342", "\u20dd",
                                         "\u0610", "\u093c"};
    const int n = 10 + static_cast<int>(below(40));
    for (int i = 0; i < n; ++i) {
      *out += pick(kBase);
      for (uint32_t k = 0, m = below(6); k < m; ++k) *out += pick(kMarks);
      if (chance(20)) *out += pick({" ", "\n", "s", "'s", ".", "x"});
    }
    *out += pick({" cafe\u0301 nai\u0308ve\n", " Z\u0351\u036b\u0343a\u0352l\u0364g"
                                                          "\u0310o\u0360\n", "\n"});
  }

  std::mt19937 rng_;
};

// ---- the test ------------------------------------------------------------------------

std::vector<uint32_t> parse_ids(const std::string& line) {
  std::vector<uint32_t> ids;
  std::istringstream in(line);
  uint32_t id;
  while (in >> id) ids.push_back(id);
  return ids;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST(Gpt2Parity, PrepareMatchesTheNpmEncoderOnThreeMegabytes) {
  const std::string gpt2 = testing::gpt2_dir();
  ASSERT_TRUE(std::filesystem::exists(gpt2 + "/package/Encoder.js"))
      << testing::gpt2_missing_hint() << " (the npm package is " << gpt2 << "/package)";
  const testing::CommandResult node = run_command("node --version");
  ASSERT_EQ(node.exit_code, 0) << "node is required for the npm reference encoder (it is "
                                  "preinstalled on the project's machines): "
                               << node.output;

  testing::ScratchDir dir;
  TextGen gen(20240601);
  std::mt19937 sizes(7);
  std::vector<std::string> files;
  std::string inputs;
  size_t total = 0;
  while (total < (size_t{3} << 20)) {
    // One long document, then short ones (the npm encoder's time grows with the square
    // of a document's length).
    const size_t size = files.empty() ? 65536 : 8192 + static_cast<size_t>(sizes() % 8192);
    const std::string doc = gen.document(size);
    ASSERT_EQ(doc.find("\xC2\x85"), std::string::npos) << "U+0085 generated";
    ASSERT_EQ(doc.find("\xEF\xBB\xBF"), std::string::npos) << "U+FEFF generated";
    const std::string name = "doc_" + std::to_string(files.size()) + ".txt";
    dir.write(name, doc);
    files.push_back(dir.file(name));
    inputs += " " + dir.file(name);
    total += doc.size();
  }
  std::printf("[ measured ] %zu documents, %zu bytes\n", files.size(), total);

  auto t0 = std::chrono::steady_clock::now();
  const testing::CommandResult ref =
      run_command("node " + std::string(TRIDENT_SOURCE_DIR) +
                  "/tests/reference/gpt2_reference_encode.js --package " + gpt2 + "/package" +
                  inputs + " 2>" + dir.file("node.err"));
  const double node_s = seconds_since(t0);
  ASSERT_EQ(ref.exit_code, 0) << ref.output.substr(0, 2000);
  std::vector<uint32_t> want;
  {
    std::istringstream lines(ref.output);
    std::string line;
    size_t n = 0;
    while (std::getline(lines, line)) {
      want.push_back(kGpt2EndOfText);
      const std::vector<uint32_t> ids = parse_ids(line);
      ASSERT_GT(ids.size(), 1000u) << files[n];
      want.insert(want.end(), ids.begin(), ids.end());
      ++n;
    }
    ASSERT_EQ(n, files.size()) << "the npm encoder printed " << n << " lines for "
                               << files.size() << " files";
  }

  t0 = std::chrono::steady_clock::now();
  const testing::CommandResult prep =
      run_command("TRIDENT_GPT2_DIR=" + gpt2 + " " + testing::trident_binary() +
                  " prepare --tokenizer gpt2 --format llmc --val-fraction 0 --shard-tokens "
                  "300000 --threads 2 --out " + dir.file("out") + " --input" + inputs);
  const double prepare_s = seconds_since(t0);
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  EXPECT_NE(prep.output.find("documents: " + std::to_string(files.size()) + "\n"),
            std::string::npos)
      << prep.output;
  EXPECT_NE(prep.output.find("invalid UTF-8 replaced by U+FFFD: "), std::string::npos)
      << prep.output;

  std::vector<uint32_t> got;
  int shards = 0;
  for (;; ++shards) {
    char name[32];
    std::snprintf(name, sizeof name, "out/train_%06d.bin", shards);
    if (!std::filesystem::exists(dir.file(name))) break;
    Result<TokenFile> shard = TokenFile::open(dir.file(name));
    ASSERT_TRUE(shard.is_ok()) << shard.status().message();
    const size_t before = got.size();
    got.resize(before + shard.value().num_tokens());
    shard.value().copy(0, shard.value().num_tokens(), got.data() + before);
  }
  EXPECT_GT(shards, 1) << "several shards, read back in order";
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/val_000000.bin")));
  std::printf("[ measured ] %zu tokens; node %.1f s, trident prepare %.2f s, %d shards\n",
              want.size(), node_s, prepare_s, shards);

  ASSERT_GT(want.size(), size_t{500000});
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    if (got[i] != want[i]) {
      // Which document, and the ids around the first difference.
      size_t doc = 0;
      for (size_t k = 0; k <= i; ++k) doc += want[k] == kGpt2EndOfText ? 1 : 0;
      std::ostringstream ctx;
      for (size_t k = (i > 8 ? i - 8 : 0); k < std::min(want.size(), i + 8); ++k) {
        ctx << (k == i ? " [" : " ") << want[k] << "/" << (k < got.size() ? got[k] : 0u)
            << (k == i ? "]" : "");
      }
      FAIL() << "first difference at token " << i << " (document " << doc - 1 << ", "
             << files[doc - 1] << "): npm/trident" << ctx.str();
    }
  }
  ASSERT_EQ(got.size(), want.size());
}

}  // namespace
}  // namespace trident
