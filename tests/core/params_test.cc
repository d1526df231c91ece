// Parameter counts, checked against figures derived by hand from each model's config.json.
// Notation: H hidden, V vocab, L layers, E experts, k top-k, I expert size, nh/nkv heads, hd
// head dim. Untied embeddings count 2*V*H. Every layer has two H-sized norms, plus one final.
#include "moe/params.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "moe/config.h"
#include "moe/error.h"

namespace moe {
namespace {

ParamCounts count_file(std::string_view file) {
  return count_params(load_hf_config(fmt::format("{}/configs/{}", MOE_TEST_DATA_DIR, file)));
}

// Qwen3-30B-A3B: H 2048, V 151936, L 48, nh 32, nkv 4, hd 128, E 128, k 8, I 768.
//   embedding      2 * 151936 * 2048                          =    622,329,856
//   attention      q,o 2 * 2048 * 4096 + k,v 2 * 2048 * 512   =     18,874,368 per layer
//   norms          2 * 2048 + q/k norms 2 * 128               =          4,352 per layer
//   router         128 * 2048                                 =        262,144 per layer
//   expert         3 * 2048 * 768                             =      4,718,592
//   layer          18,874,368 + 4,352 + 262,144 + 128 * 4,718,592 = 623,120,640
//   total          48 * 623,120,640 + 622,329,856 + 2,048     = 30,532,122,624
//   active layer   18,874,368 + 4,352 + 262,144 + 8 * 4,718,592 = 56,889,600
//   active         48 * 56,889,600 + 622,329,856 + 2,048      =  3,353,032,704
TEST(Params, Qwen3_30B_A3B) {
  const ParamCounts counts = count_params(preset_config("qwen3-30b-a3b"));
  EXPECT_EQ(counts.embedding, 622'329'856);
  EXPECT_EQ(counts.attention_per_layer, 18'874'368);
  EXPECT_EQ(counts.router_per_layer, 262'144);
  EXPECT_EQ(counts.per_expert, 4'718'592);
  EXPECT_EQ(counts.routed_experts_total, 48 * 128 * int64_t{4'718'592});
  EXPECT_EQ(counts.shared_experts_per_layer, 0);
  EXPECT_EQ(counts.moe_layer, 262'144 + 128 * int64_t{4'718'592});
  EXPECT_EQ(counts.norms_total, 48 * 4'352 + 2'048);
  EXPECT_EQ(counts.total, 30'532'122'624);            // the seed's 30.53B
  EXPECT_EQ(counts.active_per_token, 3'353'032'704);  // the seed's 3.35B
  EXPECT_NEAR(counts.expert_share(), 28'991'029'248.0 / 30'532'122'624.0, 1e-12);
}

// Qwen3-235B-A22B: H 4096, V 151936, L 94, nh 64, nkv 4, hd 128, E 128, k 8, I 1536.
//   embedding      2 * 151936 * 4096                          =  1,244,659,712
//   attention      2 * 4096 * 8192 + 2 * 4096 * 512           =     71,303,168
//   norms          2 * 4096 + 2 * 128                         =          8,448
//   router 524,288; expert 3 * 4096 * 1536                    =     18,874,368
//   layer          71,303,168 + 8,448 + 524,288 + 128 * 18,874,368 = 2,487,755,008
//   total          94 * 2,487,755,008 + 1,244,659,712 + 4,096 = 235,093,634,560
//   active         94 * (71,303,168 + 8,448 + 524,288 + 8 * 18,874,368)
//                  = 94 * 222,830,848 + 1,244,663,808          = 22,190,763,520
TEST(Params, Qwen3_235B_A22B) {
  const ParamCounts counts = count_params(preset_config("qwen3-235b-a22b"));
  EXPECT_EQ(counts.total, 235'093'634'560);
  EXPECT_EQ(counts.active_per_token, 22'190'763'520);
}

// DeepSeek-V3: H 7168, V 129280, L 61 (3 dense + 58 MoE, MTP layer not counted), 128 heads,
// q_lora 1536, kv_lora 512, nope 128, rope 64, v 128, E 256, k 8, I 2048, 1 shared, dense 18432.
//   embedding      2 * 129280 * 7168                          =  1,853,358,080
//   attention      q_a 7168 * 1536 + q_b 1536 * 128 * 192 + kv_a 7168 * 576
//                  + kv_b 512 * 128 * 256 + o 128 * 128 * 7168  =  187,105,280
//   norms          2 * 7168 + q_a 1536 + kv_a 512             =         16,384 per layer
//   dense FFN      3 * 7168 * 18432                           =    396,361,728
//   router         256 * 7168 + correction bias 256           =      1,835,264
//   expert         3 * 7168 * 2048                            =     44,040,192 (shared alike)
//   MoE FFN        1,835,264 + 257 * 44,040,192               = 11,320,164,608
//   total          61 * (187,105,280 + 16,384) + 3 * 396,361,728 + 58 * 11,320,164,608
//                  + 1,853,358,080 + 7,168                     = 671,026,419,200
//   active MoE FFN 1,835,264 + 9 * 44,040,192                 =    398,196,992
//   active         11,414,421,504 + 1,189,085,184 + 58 * 398,196,992 + 1,853,365,248
//                                                              = 37,552,297,472
TEST(Params, DeepSeekV3) {
  const ParamCounts counts = count_params(preset_config("deepseek-v3"));
  EXPECT_EQ(counts.attention_per_layer, 187'105'280);
  EXPECT_EQ(counts.dense_layer, 396'361'728);
  EXPECT_EQ(counts.router_per_layer, 1'835'264);
  EXPECT_EQ(counts.shared_experts_per_layer, 44'040'192);
  EXPECT_EQ(counts.moe_layer, 11'320'164'608);
  EXPECT_EQ(counts.norms_total, 61 * 16'384 + 7'168);
  EXPECT_EQ(counts.total, 671'026'419'200);
  EXPECT_EQ(counts.active_per_token, 37'552'297'472);
}

// Mixtral-8x7B: H 4096, V 32000, L 32, nh 32, nkv 8, hd 128, E 8, k 2, I 14336.
//   embedding 262,144,000; attention 2 * 4096 * 4096 + 2 * 4096 * 1024 = 41,943,040
//   norms 8,192; router 32,768; expert 3 * 4096 * 14336 = 176,160,768
//   total   32 * (41,943,040 + 8,192 + 32,768 + 8 * 176,160,768) + 262,144,000 + 4,096
//           = 32 * 1,451,270,144 + 262,148,096 = 46,702,792,704
//   active  32 * (41,943,040 + 8,192 + 32,768 + 2 * 176,160,768) + 262,148,096
//           = 32 * 394,305,536 + 262,148,096 = 12,879,925,248
TEST(Params, Mixtral8x7B) {
  const ParamCounts counts = count_params(preset_config("mixtral-8x7b"));
  EXPECT_EQ(counts.total, 46'702'792'704);
  EXPECT_EQ(counts.active_per_token, 12'879'925'248);
}

// OLMoE-1B-7B: H 2048, V 50304, L 16, nh 16, nkv 16, hd 128, E 64, k 8, I 1024; q/k norms
// over the whole projection (2048 + 2048).
//   embedding 206,045,184; attention 4 * 2048 * 2048 = 16,777,216; norms 4 * 2048 = 8,192
//   router 131,072; expert 3 * 2048 * 1024 = 6,291,456
//   total   16 * (16,777,216 + 8,192 + 131,072 + 64 * 6,291,456) + 206,045,184 + 2,048
//           = 16 * 419,569,664 + 206,047,232 = 6,919,161,856
//   active  16 * (16,916,480 + 8 * 6,291,456) + 206,047,232 = 1,282,017,280
TEST(Params, Olmoe) {
  const ParamCounts counts = count_params(preset_config("olmoe-1b-7b"));
  EXPECT_EQ(counts.norms_total, 16 * 8'192 + 2'048);
  EXPECT_EQ(counts.total, 6'919'161'856);
  EXPECT_EQ(counts.active_per_token, 1'282'017'280);
}

// Qwen1.5-MoE-A2.7B: H 2048, V 151936, L 24, nh 16, nkv 16, hd 128, E 60, k 4, I 1408,
// shared 5632 with a [1, H] gate, q/k/v biases.
//   attention 4 * 2048 * 2048 + 3 * 2048 = 16,783,360; norms 4,096; router 122,880
//   expert 3 * 2048 * 1408 = 8,650,752; shared 3 * 2048 * 5632 + 2048 = 34,605,056
//   total   24 * (16,783,360 + 4,096 + 122,880 + 60 * 8,650,752 + 34,605,056)
//           + 622,329,856 + 2,048 = 24 * 570,560,512 + 622,331,904 = 14,315,784,192
//   active  24 * (51,515,392 + 4 * 8,650,752) + 622,331,904
//           = 24 * 86,118,400 + 622,331,904 = 2,689,173,504
TEST(Params, Qwen2MoeA2_7B) {
  const ParamCounts counts = count_params(preset_config("qwen2-moe-a2.7b"));
  EXPECT_EQ(counts.attention_per_layer, 16'783'360);
  EXPECT_EQ(counts.shared_experts_per_layer, 34'605'056);
  EXPECT_EQ(counts.total, 14'315'784'192);
  EXPECT_EQ(counts.active_per_token, 2'689'173'504);
}

// gpt-oss-20b: H 2880, V 201088, L 24, nh 64, nkv 8, hd 64, E 32, k 4, I 2880, biases
// everywhere, one sink per head, router bias.
//   attention 2 * 2880 * 4096 + 2 * 2880 * 512 + biases (4096 + 512 + 512 + 2880) + sinks 64
//             = 26,550,144
//   router 32 * 2880 + 32 = 92,192; expert 3 * 2880 * 2880 + 2 * 2880 + 2880 = 24,891,840
//   total   24 * (26,550,144 + 5,760 + 92,192 + 32 * 24,891,840) + 1,158,266,880 + 2,880
//           = 24 * 823,186,976 + 1,158,269,760 = 20,914,757,184
//   active  24 * (26,648,096 + 4 * 24,891,840) + 1,158,269,760 = 4,187,440,704
//           (OpenAI's 3.6B leaves out the input embedding, 579,133,440)
TEST(Params, GptOss20B) {
  const ParamCounts counts = count_file("gpt_oss_20b.json");
  EXPECT_EQ(counts.attention_per_layer, 26'550'144);
  EXPECT_EQ(counts.router_per_layer, 92'192);
  EXPECT_EQ(counts.per_expert, 24'891'840);
  EXPECT_EQ(counts.total, 20'914'757'184);
  EXPECT_EQ(counts.active_per_token, 4'187'440'704);
}

// Llama-4-Scout text model: H 5120, V 202048, L 48, nh 40, nkv 8, hd 128, E 16, k 1, I 8192,
// one ungated shared expert of 8192; the vision tower is not counted.
//   attention 2 * 5120 * 5120 + 2 * 5120 * 1024 = 62,914,560; norms 10,240; router 81,920
//   expert 3 * 5120 * 8192 = 125,829,120 (shared alike)
//   total   48 * (62,914,560 + 10,240 + 81,920 + 17 * 125,829,120) + 2,068,971,520 + 5,120
//           = 48 * 2,202,101,760 + 2,068,976,640 = 107,769,861,120
//   active  48 * (63,006,720 + 2 * 125,829,120) + 2,068,976,640 = 17,172,894,720
TEST(Params, Llama4Scout) {
  const ParamCounts counts = count_file("llama4_scout_17b_16e.json");
  EXPECT_EQ(counts.total, 107'769'861'120);
  EXPECT_EQ(counts.active_per_token, 17'172'894'720);
}

// Moonlight-16B-A3B (deepseek_v3 without the q latent): H 2048, V 163840, L 27 (1 dense),
// 16 heads, kv_lora 512, nope 128, rope 64, v 128, E 64, k 6, I 1408, 2 shared, dense 11264.
//   attention q_proj 2048 * 16 * 192 + kv_a 2048 * 576 + kv_b 512 * 16 * 256
//             + o 16 * 128 * 2048 = 13,762,560; norms 2 * 2048 + 512 = 4,608
//   router 64 * 2048 + 64 = 131,136; expert 3 * 2048 * 1408 = 8,650,752
//   shared 3 * 2048 * 2816 = 17,301,504; dense 3 * 2048 * 11264 = 69,206,016
//   total   27 * 13,767,168 + 69,206,016 + 26 * (131,136 + 64 * 8,650,752 + 17,301,504)
//           + 671,088,640 + 2,048 = 15,960,110,208
//   active  371,713,536 + 69,206,016 + 26 * (131,136 + 6 * 8,650,752 + 17,301,504)
//           + 671,090,688 = 2,914,776,192
TEST(Params, MoonlightWithoutQLora) {
  const ParamCounts counts = count_file("deepseek_v3_moonlight_16b_a3b.json");
  EXPECT_EQ(counts.attention_per_layer, 13'762'560);
  EXPECT_EQ(counts.total, 15'960'110'208);
  EXPECT_EQ(counts.active_per_token, 2'914'776'192);
}

TEST(Params, TiedEmbeddingsCountTheHeadOnce) {
  MoeConfig config = preset_config("qwen3-30b-a3b");
  const ParamCounts untied = count_params(config);
  config.tie_word_embeddings = true;
  const ParamCounts tied = count_params(config);
  EXPECT_EQ(tied.embedding, 151936 * 2048);
  EXPECT_EQ(untied.total - tied.total, 151936 * 2048);
  EXPECT_EQ(untied.active_per_token - tied.active_per_token, 151936 * 2048);
}

TEST(Params, OverflowIsAnErrorNotWraparound) {
  MoeConfig config = preset_config("qwen3-30b-a3b");
  config.experts.hidden_size = int64_t{1} << 40;
  config.experts.intermediate_size = int64_t{1} << 30;
  EXPECT_THROW(count_params(config), Error);
}

TEST(Params, InvalidConfigIsRejected) {
  MoeConfig config = preset_config("mixtral-8x7b");
  config.routing.top_k = 9;
  EXPECT_THROW(count_params(config), Error);
}

TEST(Params, Bytes) {
  EXPECT_EQ(param_bytes(30'532'122'624, 16), 61'064'245'248);
  EXPECT_EQ(param_bytes(7, 4), 3);  // 28 bits round down to whole bytes
}

}  // namespace
}  // namespace moe
