#pragma once
// GPT-2's byte-level alphabet, which Hugging Face's ByteLevel pre-tokenizer and decoder use: each
// byte is shown as one printable character ('!'..'~' as themselves, space as 'Ġ', ...). dstrain
// tokenizes the bytes themselves and translates the vocabulary once, at load.
#include <optional>
#include <string>
#include <string_view>

namespace dstrain::text {

// The character that stands for `byte`.
char32_t byte_level_char(unsigned char byte);

// The bytes a byte-level token string stands for; nullopt when a character is outside the
// alphabet (such a token, e.g. a special token, is never produced by byte-level BPE).
std::optional<std::string> byte_level_decode(std::string_view token);

// `bytes` written in the byte-level alphabet (UTF-8).
std::string byte_level_encode(std::string_view bytes);

}  // namespace dstrain::text
