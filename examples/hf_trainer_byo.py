"""A Hugging Face `Trainer` measured with `pretok_lib.measure.PretokCallback` (docs/BYO.md): tokens/s, effective
tokens/s, padding and data stall of your own trainer land in OUT as a pretok run directory; `pretok report RUNS`
shows it beside the study's or a sweep's runs.

    python examples/hf_trainer_byo.py runs/hf-trainer --text corpus.txt --tokenizer tokenizer.json [--steps 20]
"""
import argparse
import re
from pathlib import Path

from datasets import Dataset
from transformers import (DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,
                          Trainer, TrainingArguments)

from pretok_lib.measure import PretokCallback

p = argparse.ArgumentParser()
p.add_argument("out"), p.add_argument("--text", required=True, help="a text file, documents split by blank lines")
p.add_argument("--tokenizer", required=True, help="a Hugging Face tokenizer.json")
p.add_argument("--steps", type=int, default=20), p.add_argument("--batch", type=int, default=8)
p.add_argument("--seq-len", type=int, default=128)
a = p.parse_args()

tok = PreTrainedTokenizerFast(tokenizer_file=a.tokenizer)
tok.pad_token = tok.pad_token or tok.eos_token or tok.convert_ids_to_tokens(0)  # padding is masked out anyway
docs = [d for d in re.split(r"\n\s*\n", Path(a.text).read_text()) if d.strip()]
train = Dataset.from_dict({"text": docs}).map(lambda b: tok(b["text"], truncation=True, max_length=a.seq_len),
                                               batched=True, remove_columns=["text"])  # tokenized on the fly
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=a.seq_len))
args = TrainingArguments(output_dir=str(Path(a.out).parent / f".{Path(a.out).name}-trainer"), max_steps=a.steps,
                         per_device_train_batch_size=a.batch, learning_rate=1e-3, logging_steps=1, report_to=[],
                         save_strategy="no", dataloader_num_workers=0, seed=0)
trainer = Trainer(model=model, args=args, train_dataset=train,
                  data_collator=DataCollatorForLanguageModeling(tok, mlm=False),  # pads each batch to its longest
                  callbacks=[PretokCallback(a.out, data_kind="hf-trainer-padded", seq_len=a.seq_len)])
trainer.train()
print(f"measured {a.steps} Trainer steps into {a.out}")
