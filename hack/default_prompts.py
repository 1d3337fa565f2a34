"""Write the probe's default prompt set: operator/specdec_operator/probe/data/default-prompts.jsonl.

Every sentence here was written for this project (no public dataset is copied). The prompts are composed from
hand-written tasks and subjects per kind, so a few hundred prompts come from a few dozen lines of text; the kinds
are code, chat, reasoning/math, summarisation and other languages (German, French, Spanish, Japanese, Chinese,
Portuguese, Italian, Russian). Deterministic: run it again and the file does not change.

Usage: python hack/default_prompts.py
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "operator" / "specdec_operator" / "probe" / "data" / "default-prompts.jsonl"

CODE_TASKS = [
    "Write a Python function that {x}. Include type hints and a short docstring.",
    "Implement in Go a function that {x}. Show a small test for it.",
    "Write a TypeScript function that {x}, and explain its time complexity.",
    "In Rust, write a function that {x}. Handle the edge cases explicitly.",
    "Review this idea and then write C code for it: a function that {x}.",
    "Write a SQL query or a Python script, whichever fits better, that {x}.",
]
CODE_SUBJECTS = [
    "returns the k most frequent words of a text",
    "merges two sorted lists into one sorted list without using sort",
    "parses an ISO 8601 duration such as PT1H30M into seconds",
    "checks whether a string of brackets is balanced",
    "computes the longest common prefix of a list of strings",
    "groups log lines by their HTTP status code and counts them",
    "retries an HTTP request with exponential backoff and jitter",
    "converts a Roman numeral to an integer",
    "finds the shortest path in a grid with obstacles using BFS",
    "deduplicates a list while keeping the first occurrence order",
]
CHAT_TASKS = [
    "{x}",
    "I have a question: {x} Please keep the answer practical.",
    "Can you help me? {x}",
    "{x} Answer as a friendly assistant would, in a few paragraphs.",
    "My friend asked me this and I did not know what to say. {x}",
    "{x} Give me three options and say which one you would pick.",
]
CHAT_SUBJECTS = [
    "How do I prepare for a job interview at a small software company?",
    "What is a good way to start running if I have never done sport?",
    "How can I keep houseplants alive in a dark apartment?",
    "What should I pack for a week of hiking in the mountains in autumn?",
    "How do I politely decline an invitation to a wedding?",
    "What are some ideas for a birthday present for my grandmother?",
    "How do I explain to a child why the sky is blue?",
    "What is the difference between a virus and a bacterium?",
    "How can I make my morning routine less stressful?",
    "Why do cats purr, and what does it mean?",
]
MATH_TASKS = [
    "Solve step by step: {x}",
    "Think carefully and show your reasoning. {x}",
    "{x} Explain each step, then give the final answer on its own line.",
    "A student asks: {x} Walk through the solution.",
    "Reason it out before answering: {x}",
]
MATH_SUBJECTS = [
    "A train leaves at 9:15 and travels 240 km at 80 km/h. When does it arrive?",
    "If 3x + 7 = 25, what is x?",
    "A shop sells pens at 3 for 2 euros. How much do 18 pens cost?",
    "What is the sum of the integers from 1 to 200?",
    "A rectangle has a perimeter of 36 cm and its length is twice its width. What is its area?",
    "Two dice are rolled. What is the probability that the sum is 8?",
    "Compute 17% of 2,350 and round to the nearest whole number.",
    "A tank fills in 6 hours with one pipe and in 4 hours with another. How long with both?",
    "Find all real solutions of x^2 - 5x + 6 = 0.",
    "A population grows by 4% a year from 50,000. What is it after 3 years?",
    "Is 391 a prime number? Justify the answer.",
    "Three friends split a bill of 87.60 so that one pays twice as much as each of the others. What does each pay?",
]
PASSAGES = [
    "The city council met on Tuesday to discuss the new bicycle lanes. Shop owners on the main street worried that "
    "fewer parking spaces would keep customers away, while cyclists pointed to a year of data from a neighbouring "
    "town where sales rose after similar lanes were built. The council agreed to a six-month trial on two streets, "
    "with counts of cyclists and a survey of shops before and after.",
    "Our quarterly report shows revenue up 12% over the same quarter last year, driven by the subscription product, "
    "while hardware sales fell by 5%. Operating costs rose mainly because of two new support centres. The board "
    "expects hardware to stabilise next year and plans to invest in the subscription platform's reliability.",
    "Researchers tracked 400 volunteers for two years to see whether a short walk after meals changes blood sugar. "
    "Those who walked ten minutes after dinner had lower peaks on average, although the effect was small for people "
    "who already exercised regularly. The authors call for a larger trial with a more diverse group.",
    "The incident began at 02:10 when a configuration change removed the health check from the load balancer. "
    "Traffic kept flowing to two servers that had run out of disk space, and about 8% of requests failed for 40 "
    "minutes. The on-call engineer rolled back the change at 02:50. Follow-ups: validate health checks in CI, alert "
    "on disk usage at 80%, and add a canary stage for load balancer changes.",
    "The novel follows a lighthouse keeper who finds letters hidden in the walls of the tower. Each letter was "
    "written by a previous keeper, and together they tell the story of a shipwreck that the village never spoke "
    "about. The keeper must decide whether to share what she learned with the families who still live there.",
    "The new library opens on Monday with longer hours, a maker space with 3D printers and a quiet floor for study. "
    "Members can borrow laptops for two weeks. Children's story time moves to Saturday mornings, and the old "
    "building will become a community centre after renovation next spring.",
    "Meeting notes: the team agreed to move the release from the 3rd to the 10th because the payment integration "
    "failed two tests. Anna owns the fix, Ben updates the documentation, and the marketing email is postponed. The "
    "next check-in is Thursday; if the tests pass by then, the 10th stays, otherwise the release moves to the 17th.",
    "Glaciers in the region have lost about a third of their volume since 1980, according to a survey that combined "
    "satellite images with measurements on the ice. Meltwater feeds rivers that farms depend on in summer, so the "
    "loss could shift water shortages earlier in the year. The survey recommends new reservoirs and water pricing.",
    "Customer email: I ordered a blue jacket in size M two weeks ago. The parcel arrived yesterday with a black "
    "jacket in size L. I would like the right one sent as soon as possible and a return label for the wrong one. I "
    "need the jacket for a trip on the 20th, so if it cannot arrive by then, please refund me instead.",
    "The study compared three ways to teach fractions to ten-year-olds: pizza diagrams, number lines and a board "
    "game. After six weeks, the number-line group scored highest on new problems, while the game group enjoyed the "
    "lessons most. Teachers said a mix of the methods would likely work best in a real classroom.",
]
SUMMARY_TASKS = [
    "Summarise the following text in three sentences:\n\n{x}",
    "Give a one-paragraph summary and a list of the key facts:\n\n{x}",
    "TL;DR this for a busy manager:\n\n{x}",
    "Summarise this in plain language for a teenager:\n\n{x}",
    "What are the main points of this text? Use bullet points.\n\n{x}",
]
LANGUAGE_PROMPTS = {
    "de": [
        "Erkläre in einfachen Worten, wie eine Wärmepumpe funktioniert.",
        "Schreibe eine kurze E-Mail an meinen Vermieter, dass die Heizung nicht funktioniert.",
        "Was sind die Vor- und Nachteile von Homeoffice? Antworte ausführlich.",
        "Fasse die Geschichte von Rotkäppchen in fünf Sätzen zusammen.",
        "Gib mir ein einfaches Rezept für einen Apfelkuchen.",
        "Wie lerne ich am besten eine neue Sprache in sechs Monaten?",
        "Schreibe ein kurzes Gedicht über den Herbst im Wald.",
        "Erkläre den Unterschied zwischen Wetter und Klima.",
        "Welche Sehenswürdigkeiten sollte man in Hamburg an einem Wochenende besuchen?",
    ],
    "fr": [
        "Explique simplement comment fonctionne un vaccin.",
        "Écris une lettre de motivation courte pour un poste de boulanger.",
        "Quels sont les avantages et les inconvénients de la voiture électrique ?",
        "Raconte une petite histoire pour enfants avec un renard et une chouette.",
        "Donne-moi une recette facile de ratatouille.",
        "Comment organiser un voyage de trois jours à Lyon ?",
        "Explique la différence entre un prêt à taux fixe et un prêt à taux variable.",
        "Écris un court poème sur la mer en hiver.",
        "Pourquoi les feuilles des arbres changent-elles de couleur en automne ?",
    ],
    "es": [
        "Explica de forma sencilla qué es la inflación.",
        "Escribe un correo para pedir un día libre a mi jefe.",
        "¿Cuáles son los beneficios de dormir ocho horas?",
        "Cuenta una historia corta sobre un gato que viaja en tren.",
        "Dame una receta fácil de tortilla de patatas.",
        "¿Cómo puedo ahorrar dinero cada mes con un sueldo pequeño?",
        "Explica cómo se forma un arcoíris.",
        "Escribe un poema breve sobre la ciudad de noche.",
        "¿Qué debo visitar en Sevilla si tengo dos días?",
    ],
    "ja": [
        "光合成の仕組みを中学生にもわかるように説明してください。",
        "上司に会議の日程変更をお願いするメールを書いてください。",
        "健康的な朝ごはんのアイデアを五つ教えてください。",
        "猫と犬が友達になる短い物語を書いてください。",
        "京都で一日観光するおすすめのルートを教えてください。",
        "プログラミングを独学で始めるにはどうすればいいですか。",
        "地震が起きたときに家でするべきことを説明してください。",
        "春についての短い詩を書いてください。",
    ],
    "zh": [
        "请用简单的话解释什么是人工智能。",
        "帮我写一封感谢老师的信。",
        "学习一门新的编程语言有哪些好方法？",
        "请讲一个关于月亮和小兔子的短故事。",
        "如何在家做一道简单的番茄炒蛋？",
        "去北京旅游三天，有什么推荐的行程？",
        "解释一下为什么海水是咸的。",
        "写一首关于秋天的短诗。",
    ],
    "pt": [
        "Explique de forma simples como funciona a energia solar.",
        "Escreva uma mensagem para um amigo convidando-o para um churrasco.",
        "Quais são as dicas para uma boa noite de sono?",
        "Conte uma história curta sobre um pescador e uma tartaruga.",
        "Como posso organizar melhor o meu tempo de estudo?",
        "Dê uma receita fácil de pão de queijo.",
    ],
    "it": [
        "Spiega in modo semplice come funziona la fotosintesi.",
        "Scrivi una breve email per prenotare un tavolo al ristorante.",
        "Quali sono i vantaggi di andare al lavoro in bicicletta?",
        "Racconta una breve storia su un gondoliere di Venezia.",
        "Dammi una ricetta semplice per la pasta al pomodoro.",
        "Cosa visitare a Roma in un solo giorno?",
    ],
    "ru": [
        "Объясни простыми словами, что такое чёрная дыра.",
        "Напиши короткое письмо другу о своих летних каникулах.",
        "Какие есть способы меньше уставать на работе?",
        "Расскажи короткую сказку о медведе и лисе.",
        "Как приготовить простой борщ?",
        "Что посмотреть в Санкт-Петербурге за два дня?",
    ],
}
LANGUAGE_SUFFIX = {
    "de": ["", " Antworte bitte auf Deutsch."],
    "fr": ["", " Réponds en français, s'il te plaît."],
    "es": ["", " Responde en español, por favor."],
    "ja": ["", " 日本語で答えてください。"],
    "zh": ["", " 请用中文回答。"],
    "pt": ["", " Responda em português."],
    "it": ["", " Rispondi in italiano."],
    "ru": ["", " Ответь по-русски."],
}
SYSTEM = "You are a helpful assistant."


def build() -> list[dict]:
    prompts: list[dict] = []

    def add(text: str, *, system: bool = False) -> None:
        messages = ([{"role": "system", "content": SYSTEM}] if system else []) + [{"role": "user", "content": text}]
        prompts.append({"messages": messages})

    for i, subject in enumerate(CODE_SUBJECTS):
        for j, task in enumerate(CODE_TASKS):
            add(task.format(x=subject), system=(i + j) % 3 == 0)
    for i, subject in enumerate(CHAT_SUBJECTS):
        for j, task in enumerate(CHAT_TASKS):
            add(task.format(x=subject).strip(), system=(i + j) % 2 == 0)
    for i, subject in enumerate(MATH_SUBJECTS):
        for j, task in enumerate(MATH_TASKS):
            add(task.format(x=subject), system=(i + j) % 4 == 0)
    for i, passage in enumerate(PASSAGES):
        for j, task in enumerate(SUMMARY_TASKS):
            add(task.format(x=passage), system=(i + j) % 3 == 1)
    for lang, texts in LANGUAGE_PROMPTS.items():
        for i, text in enumerate(texts):
            for j, suffix in enumerate(LANGUAGE_SUFFIX[lang]):
                add(text + suffix, system=(i + j) % 2 == 1)
    # Interleave the kinds, so that any contiguous sample (the first 4 requests of a round) is mixed.
    kinds = [prompts[0:60], prompts[60:120], prompts[120:180], prompts[180:230], prompts[230:]]
    mixed: list[dict] = []
    for i in range(max(len(k) for k in kinds)):
        mixed.extend(k[i] for k in kinds if i < len(k))
    return mixed


def main() -> None:
    prompts = build()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in prompts), encoding="utf-8")
    print(f"{len(prompts)} prompts -> {OUT}")


if __name__ == "__main__":
    main()
