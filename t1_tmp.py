import os, tempfile
from hifc import LLM, SamplingParams
d=tempfile.mkdtemp()
P=SamplingParams(max_tokens=8,temperature=0,ignore_eos=True)
base=dict(device="cpu",dtype="float32",block_size=16,max_model_len=160)
ref=LLM("smollm2-135m",num_gpu_blocks=64,enable_prefix_caching=False,**base)
tok=ref.get_tokenizer()
sysmsg="You are the support assistant of a company that builds flash storage for AI servers. Answer briefly and precisely, name the component involved, and say when you are unsure. "*2
prompts=[tok.apply_chat_template([{"role":"system","content":sysmsg},{"role":"user","content":q}],add_generation_prompt=True) for q in ["What is WAF?","Why append?","What is GDS?"]]
exp=[o.token_ids for o in ref.generate(prompts,P,use_tqdm=False)]
flash=dict(kv_offload="flash",flash_path=os.path.join(d,"kv"),flash_size_gib=0.05, prefix_store_read="always")
llm=LLM("smollm2-135m",num_gpu_blocks=12,**base,**flash)
out=[o.token_ids for o in llm.generate(prompts,P,use_tqdm=False)]
print(out==exp); print({k:v for k,v in llm.stats().items() if 'prefix' in k or 'gpu' in k})
out=[o.token_ids for o in llm.generate(prompts,P,use_tqdm=False)]
print(out==exp); print({k:v for k,v in llm.stats().items() if 'prefix' in k or 'gpu' in k})
llm.close()
print({k:v for k,v in llm.stats().items() if 'prefix' in k})
llm2=LLM("smollm2-135m",num_gpu_blocks=12,**base,**flash)
outs=llm2.generate(prompts,P,use_tqdm=False)
print([o.token_ids for o in outs]==exp, [o.num_cached_tokens for o in outs]); print({k:v for k,v in llm2.stats().items() if 'prefix' in k or 'gpu' in k})
llm2.close()
