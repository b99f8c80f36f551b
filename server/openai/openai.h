/* server/openai/openai.h — the OpenAI API routes (completions.c: /v1/completions and
 * /v1/chat/completions; routes.c: health, models, metrics, tokenize), registered by server/serve.c. */
#ifndef GS_SRV_OPENAI_H
#define GS_SRV_OPENAI_H

#include "server/core/srv.h"

int srv_route_completions(srv_state *s, struct mg_connection *c);
int srv_route_chat(srv_state *s, struct mg_connection *c);
/* Route handlers that live outside oai_run.c. */
int srv_route_health(srv_state *s, struct mg_connection *c);
int srv_route_models(srv_state *s, struct mg_connection *c);
int srv_route_model_one(srv_state *s, struct mg_connection *c); /* GET /v1/models/{id} */
int srv_route_metrics(srv_state *s, struct mg_connection *c);
int srv_route_tokenize(srv_state *s, struct mg_connection *c);
int srv_route_detokenize(srv_state *s, struct mg_connection *c);


/* vLLM's prompt_logprobs of a choice whose prompt was scored (g.prompt_logprobs >= 0): [null,
 * {"<id>": {"logprob", "rank", "decoded_token"}}, ...]. Read once the choice has a token or finished. */
cJSON *srv_prompt_logprobs_vllm(const srv_job *j, const srv_choice *ch);

#endif
