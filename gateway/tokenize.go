package gateway

import (
	"encoding/json"
	"net/http"
)

// tokenizeRequest is the body of POST /tokenize, as vLLM's server takes it:
// a prompt, encoded as a completion's is, or a conversation, rendered
// through the model's chat template as a chat completion's is (tools and
// chat_template_kwargs included), so that the count is the prompt tokens
// the request would use.
type tokenizeRequest struct {
	Model               string                     `json:"model"`
	Prompt              *string                    `json:"prompt"`
	Messages            []chatMessage              `json:"messages"`
	Tools               json.RawMessage            `json:"tools"`
	AddGenerationPrompt *bool                      `json:"add_generation_prompt"`
	ChatTemplateKwargs  map[string]json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort     *string                    `json:"reasoning_effort"`
}

type tokenizeResponse struct {
	Count       int     `json:"count"`
	MaxModelLen int     `json:"max_model_len"`
	Tokens      []int32 `json:"tokens"`
	TokenStrs   any     `json:"token_strs"`
}

// detokenizeRequest is the body of POST /detokenize.
type detokenizeRequest struct {
	Model  string  `json:"model"`
	Tokens []int32 `json:"tokens"`
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if !s.readJSON(w, r, &req) {
		return
	}
	ids, m, aerr := s.val.tokenize(&req)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(ids), MaxModelLen: m.ContextLength, Tokens: nonNil(ids)})
}

// tokenize validates a tokenize request and returns its tokens.
func (v *validator) tokenize(r *tokenizeRequest) ([]int32, ModelInfo, *apiError) {
	m, aerr := v.model(r.Model)
	if aerr != nil {
		return nil, m, aerr
	}
	switch {
	case r.Prompt != nil && r.Messages != nil:
		return nil, m, invalidParam("prompt", "send either prompt or messages, not both")
	case r.Prompt != nil:
		return v.tok.Encode(*r.Prompt), m, nil
	case r.Messages == nil:
		return nil, m, invalidParam("prompt", "tokenize needs a prompt or messages")
	case v.tmpl == nil:
		return nil, m, badRequest("messages", "chat_unsupported", "model %q has no chat template; send a prompt instead of messages", m.ID)
	}
	tools, aerr := parseTools(r.Tools)
	if aerr != nil {
		return nil, m, aerr
	}
	text, aerr := v.chatText(r.Messages, tools, r.AddGenerationPrompt, r.ChatTemplateKwargs, r.ReasoningEffort, "")
	if aerr != nil {
		return nil, m, aerr
	}
	return v.tok.Encode(text), m, nil
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req detokenizeRequest
	if !s.readJSON(w, r, &req) {
		return
	}
	m, aerr := s.val.model(req.Model)
	if aerr != nil {
		writeAPIError(w, aerr)
		return
	}
	if k := badTokenID(req.Tokens, m.VocabSize); k >= 0 {
		writeAPIError(w, invalidParam("tokens", "token id %d at position %d is outside the vocabulary [0, %d)", req.Tokens[k], k, m.VocabSize))
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": s.val.tok.Decode(req.Tokens, false)})
}
