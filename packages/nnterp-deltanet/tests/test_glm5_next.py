import subprocess
import sys

from nnterp.testing import PROMPT, close, family_suite, save_tiny


class TestGlm5Next(family_suite("glm5_next")):
    def test_the_final_norm_reads_the_mean_of_the_streams(self) -> None:
        with self.model.trace(PROMPT):
            leaving = self.model.layers[-1].layer_output.save()
            final = self.model.ln_final.input.save()
        close(final, leaving.mean(dim=-2), what="the final norm's input vs the mean of the last block's streams")

    def test_a_fresh_process_loads_the_wrapper_by_path_for_text(self, tmp_path) -> None:
        """transformers maps no causal LM to glm5_next: loading one by path registers the wrapper first."""
        save_tiny(self.family, str(tmp_path))  # the text checkpoint: a tokenizer, no processor
        script = (
            "import sys; from nnterp import StandardizedTransformer\n"
            "model = StandardizedTransformer(sys.argv[1])\n"
            "with model.generate('The cat', max_new_tokens=2, min_new_tokens=2, do_sample=False) as tracer:\n"
            "    tokens = tracer.result.save()\n"
            "print(type(model._module).__name__, tokens.shape[-1] - len(model.tokenizer('The cat').input_ids))\n"
        )
        run = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split()[-2:] == ["Glm5NextForConditionalGeneration", "2"], run.stdout
